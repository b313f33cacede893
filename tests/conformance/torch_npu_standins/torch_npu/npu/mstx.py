"""STAND-IN for ``torch_npu.npu.mstx`` (MindStudio Tools Extension markers; NOT torch_npu's code)."""


class _Mstx:
    def __init__(self):
        self._next = 0

    def range_start(self, message="", stream=None, domain="default"):
        self._next += 1
        return self._next

    def range_end(self, range_id, domain="default"):
        return None

    def mark(self, message="", stream=None, domain="default"):
        return None


mstx = _Mstx()
