"""The engine's tools: profiling, the benchmark (bench), timed startup (startup), training the shipped
models (train), checkpoint I/O measurements (checkpoint_io) and test fixtures (testing). The engine's core never
needs them."""
