"""The TritonModel controller: each model's replicas placed, its status written, its hosts and
Service kept, its rolls to a new storageUri."""
