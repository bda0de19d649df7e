"""Generated protobuf/gRPC stubs (python -m kvmesh.runtime.protogen). Do not edit."""
