"""`tritonshare` (and `kubectl tritonshare`): status, explain, quota and the uninstall cleanup."""
