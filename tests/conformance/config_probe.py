"""Run torch_npu's REAL config parsing on a list of configs and report what it does (conformance helper process).

stdin: a JSON list of config objects. stdout (last line): a JSON list, one result per config:
``{"messages": [...], "error": str|null, "start_step", "active", "warmup", "valid", "analyse", "async_mode",
"activities", "metadata"}``. ``messages`` are every line torch_npu logged (its dynamic-profile logger) or printed
(``print_warn_msg``: rank 0 only, so run with ``RANK=0``) while it:

1. loads the JSON as the monitor does (``data["is_valid"] = True``),
2. builds ``ConfigContext`` and calls ``valid()`` (the rank's ``rank_list`` filter),
3. builds the ``profile`` object exactly as ``_DynamicProfile.enable_prof`` does (schedule, trace handler,
   flags, experimental config) and adds the metadata with ``add_metadata_json``; the profiler is not started.

Needs the isolated monitor tree on ``PYTHONPATH`` (``tests/conformance/real_torch_npu.py``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import warnings
from typing import Any


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def probe(raw: Any) -> dict[str, Any]:
    from torch_npu.profiler._dynamic_profiler._dynamic_profiler_config_context import ConfigContext
    from torch_npu.profiler._dynamic_profiler._dynamic_profiler_utils import DynamicProfilerUtils
    from torch_npu.profiler.profiler import profile, tensorboard_trace_handler
    from torch_npu.profiler.scheduler import Schedule

    handler = _Lines()
    DynamicProfilerUtils.LOGGER.setLevel(logging.DEBUG)
    DynamicProfilerUtils.LOGGER.addHandler(handler)
    out = io.StringIO()
    res: dict[str, Any] = {"error": None}
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                data = json.loads(json.dumps(raw))
                data["is_valid"] = True  # what the monitor process adds to a file it could read
            except Exception as exc:  # noqa: BLE001 - the monitor logs "load json failed, <exc>"
                res["error"] = f"load json failed, {exc}"
                data = None
            if data is not None:
                try:
                    ctx = ConfigContext(data)
                    res["dyno_monitor"] = ctx.is_dyno_monitor()
                    valid = ctx.valid()
                    res.update(start_step=ctx.start_step(), active=ctx.active(), warmup=ctx.warmup(), valid=valid,
                               analyse=ctx.analyse(), async_mode=ctx.async_mode(),
                               activities=sorted(a.name for a in ctx.activities()), metadata=ctx.meta_data())
                    prof = profile(
                        activities=ctx.activities(),
                        schedule=Schedule(wait=0, warmup=ctx.warmup(), active=ctx.active(), repeat=1, skip_first=0),
                        on_trace_ready=tensorboard_trace_handler(ctx.prof_path, analyse_flag=ctx.analyse(),
                                                                 async_mode=ctx.async_mode()),
                        record_shapes=ctx.record_shapes, profile_memory=ctx.profile_memory,
                        with_stack=ctx.with_stack, with_flops=ctx.with_flops, with_modules=ctx.with_modules,
                        experimental_config=ctx.experimental_config,
                    )
                    for key, value in ctx.meta_data().items():
                        prof.add_metadata_json(str(key), json.dumps(value))
                    res["metadata_kept"] = sorted(prof.metadata)
                    prof.stopped = True  # never started: keep __del__ from calling stop()
                except Exception as exc:  # noqa: BLE001 - dp.step() would print "Call step failed. Exception: ..."
                    res["error"] = f"{type(exc).__name__}: {exc}"
        res["messages"] = handler.lines + [ln for ln in out.getvalue().splitlines() if ln.strip()] + [
            str(w.message) for w in caught]
    finally:
        DynamicProfilerUtils.LOGGER.removeHandler(handler)
    return res


def main() -> None:
    import os

    if os.environ.get("PROFWATCH_CONFORMANCE_COVERAGE"):
        import coverage

        cov = coverage.Coverage(config_file=os.path.join(os.environ["PROFWATCH_CONFORMANCE_COVERAGE"], "coveragerc"),
                                auto_data=True)
        cov.start()  # saved at exit
    configs = json.load(sys.stdin)
    print(json.dumps([probe(c) for c in configs], default=str))


if __name__ == "__main__":
    main()
