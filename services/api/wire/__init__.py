"""Wire models: the Vertex AI resources as proto3 JSON, parsed and printed with pydantic."""
