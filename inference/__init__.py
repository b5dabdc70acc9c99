"""The model work below the library: the engine (`engine/`, no Django: MLX,
batching, the prompt cache, grammars) and the protocol layer (`protocols/`:
wire JSON to engine requests and engine events back to wire JSON)."""
