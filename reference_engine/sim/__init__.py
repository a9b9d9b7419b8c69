"""The engine's simulation lab: the modeled GPU clock (gpu_model), workload traces (trace) and their
replay (replay), fault injection (faults) and a replica router (router). The engine's core never needs them."""
