"""STAND-IN for the native extension ``torch_npu._C`` (profwatch conformance tests; NOT torch_npu's code)."""
