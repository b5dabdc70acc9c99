"""The wire protocols (OpenAI, Anthropic, Responses, embeddings) through the official SDKs, and their parsers."""
