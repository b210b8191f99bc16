"""The agent API's protobuf definition and its generated code (committed; `make proto`)."""
