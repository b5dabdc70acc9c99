"""The local model library over the Hugging Face cache."""
