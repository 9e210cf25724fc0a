"""The HTTP edge: REST (and later SSE) over the internal gRPC services, API keys and memberships."""
