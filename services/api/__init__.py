"""The Vertex AI REST surface: resource names, proto3 JSON, paging, Operations, errors, auth."""
