"""Reference solutions, one module per lesson; exercises/ is generated from these."""
import reference_engine  # noqa: F401 - on CPU it switches Triton to its interpreter before any kernel is defined
