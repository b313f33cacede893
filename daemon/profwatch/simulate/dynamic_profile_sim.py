"""SIMULATOR: a faithful fake of torch_npu's ``dynamic_profile`` protocol (I/O; no NPU, no torch needed).

NOT torch_npu. Used through the fake package ``daemon/profwatch/simulate/fake_torch_npu/torch_npu`` (importable only when a
test or ``profwatch simulate`` puts that folder on ``sys.path``). It reproduces what a daemon and a wrapper hook
can observe of torch-npu 2.13/2.14 (``docs/torch_npu-dynamic-profile.md``; compared with the real monitor by
``tests/conformance/test_fake_matches_real.py``, differences in ``docs/conformance.md``):

* monitor (config polling): a poller per process and config path (the real one is one forked process per node)
  takes ``int(getmtime(path))`` by path; the baseline is the mtime at init, so a pre-written config is never
  loaded; a changed mtime is re-read: invalid JSON -> ``{"is_valid": false}`` + monitor log ERROR, an empty
  file -> ``{}``, over 1 MiB -> skipped; poll interval 2 s, then the step-10->11 time truncated and clamped to
  [1, 50] s (``PROFWATCH_SIM_POLL_INTERVAL_S`` overrides it: a simulator-only knob for fast tests);
* rank (mtime rules, start_step): a payload is accepted only if its mtime is strictly newer than the rank's init time /
  last accepted mtime; the config is parsed with torch_npu's resets (invalid start_step -> 0, active -> 1,
  warmup -> 0, non-bool flags -> False) and logs "Start step will be set to N."; one pending slot; ``-1`` starts
  now, ``cur_step == start_step`` starts, a passed start_step is "not effective" (stdout, rank 0 only), a
  config arriving during a capture waits until the first step after it; ``is_rank``/``rank_list``;
* logs (dp logs): ``<path>/log/dp_{host}_{pid}_rank_{rank}.log`` and ``monitor_dp_...`` with torch_npu's
  messages and format, rotating at 200 KB with one backup;
* output (output layout): ``{host}_{pid}_{YYYYmmddHHMMSSfff}_ascend_pt`` under ``prof_dir`` created at start with
  ``FRAMEWORK/``; at stop ``profiler_info_{rank}.json`` then ``profiler_metadata.json`` (config metadata +
  ``trace_id``), "Stop Dynamic Profiler at N step."; with effective ``analyse`` the parse recreates
  ``ASCEND_PROFILER_OUTPUT/`` with DBs from :func:`profwatch.simulate.ascend_tree.write_rank_dir` and writes
  ``analyse.done`` last (on a thread when ``async_mode``; awaited at exit).

Timings: the captured steps' windows are the measured intervals between ``step()`` calls; compute/collective
segments come from :func:`record_segment` (an extra, non-torch_npu function for simulated jobs) or are
synthesised inside each step window. ``profiler_info`` carries ``profwatch_sim.steps`` (the recorded steps).
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from profwatch.simulate.dynamic_profile_config_sim import TEMPLATE, ConfigContext, print_warn

CFG_FILE = "profiler_config.json"
MAX_BYTES = 1048576
POLL_ENV = "PROFWATCH_SIM_POLL_INTERVAL_S"
FAKE_VERSION = "2.14.0+profwatch.sim"

def _rank_id() -> int:
    try:
        return int(os.environ.get("RANK", "-1"))
    except ValueError:
        return -1


def _make_logger(path: str, name: str) -> logging.Logger:
    log_dir = os.path.join(path, "log")
    os.makedirs(log_dir, mode=0o750, exist_ok=True)
    lg = logging.getLogger(f"profwatch.sim.dp.{name}")
    lg.propagate = False
    lg.setLevel(logging.INFO)
    h = logging.handlers.RotatingFileHandler(os.path.join(log_dir, name), maxBytes=200 * 1024, backupCount=1)
    h.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] [%(process)d] _dynamic_profiler_utils.py: %(message)s"))
    lg.handlers[:] = [h]
    return lg


class _Capture:
    def __init__(self, ctx: ConfigContext, start_step: int, rank_dir: str) -> None:
        self.ctx = ctx
        self.start_step = start_step
        self.rank_dir = rank_dir
        self.warmup, self.active = ctx.warmup(), ctx.active()
        self.remaining = self.warmup + self.active
        self.start_ns = time.time_ns()
        self.start_mono_ns = time.monotonic_ns()
        self.step_marks: dict[int, int] = {start_step: self.start_ns}  # step k begins at the end of call k
        self.segments: list[tuple[str, int, int, str | None, int]] = []  # kind, start, end, name, wait_ns


class DynamicProfileSim:
    """One process's fake ``dynamic_profile`` state (the real module keeps a singleton too)."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.cur_step = 0
        self.rank = _rank_id()
        self.host = socket.gethostname()
        self.log: logging.Logger | None = None
        self._mlog: logging.Logger | None = None
        self._shm: tuple[int, dict[str, Any]] | None = None  # [uint32 mtime][JSON] slot
        self._cur_time = 0
        self._pending: ConfigContext | None = None
        self._cap: _Capture | None = None
        self._interval = 2.0
        self._t10 = 0.0
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._parses: list[threading.Thread] = []

    # -- public API (dp.init / step / start / set_state) --------------------------------------------------------
    def init(self, path: str) -> None:
        if self.path is not None:
            print_warn("Init dynamic profiling repeatedly")
            return
        path = os.path.abspath(path)
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.rank = _rank_id()
        self.log = _make_logger(path, f"dp_{self.host}_{os.getpid()}_rank_{self.rank}.log")
        self._cur_time = int(time.time())
        self.log.info("Rank %d shared memory is created.", self.rank)
        cfg = os.path.join(path, CFG_FILE)
        try:
            fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
            with os.fdopen(fd, "w") as f:
                json.dump(TEMPLATE, f, indent=4)
            os.chmod(cfg, 0o640)
            self.log.info("Create profiler_config.json default.")
        except FileExistsError:
            pass
        self._mlog = _make_logger(path, f"monitor_dp_{self.host}_{os.getpid()}_rank_{self.rank}.log")
        baseline = int(os.path.getmtime(cfg)) if os.path.exists(cfg) else 0
        env = os.environ.get(POLL_ENV, "").strip()
        self._fixed = float(env) if env else None
        self._monitor = threading.Thread(target=self._monitor_loop, args=(cfg, baseline), name="DynMonitorProc",
                                         daemon=True)
        self._monitor.start()
        self.log.info("Dynamic monitor process has been created by rank %d.", self.rank)
        atexit.register(self._exit)

    def step(self) -> None:
        if self.path is None and self._cap is not None:
            raise AttributeError("'NoneType' object has no attribute 'shm_to_prof_conf_context'")
        self.cur_step += 1
        n = self.cur_step
        shm = self._shm
        if shm is not None and shm[0] > self._cur_time and self.log is not None:
            self._cur_time = shm[0]
            ctx = ConfigContext(shm[1], self.rank, self.log)
            if ctx.valid():  # torch_npu keeps the pending config when the new one is not for this rank
                self._pending = ctx
        if n == 10:
            self._t10 = time.monotonic()
        elif n == 11 and self._t10:
            self._interval = float(min(50, max(1, int(time.monotonic() - self._t10))))
            if self.log:
                self.log.info("Dynamic profiling monitor process poll interval time change to %ds", int(self._interval))
        cap = self._cap
        if cap is not None:
            cap.step_marks[n] = time.time_ns()
            cap.remaining -= 1
            if cap.remaining <= 0:
                self._stop_capture()
            return
        p = self._pending
        if p is None:
            return
        p.active(), p.warmup()  # torch_npu computes the window length (and logs resets) on every pending step
        if n > p.start_step and p.start_step != -1:
            self._pending = None
            print_warn(f"Dynamic Profiler config is not effective. The start_step={p.start_step}, current_step={n}")
        elif p.start_step == -1 or n == p.start_step:
            self._pending = None
            self._start_capture(p)

    def start(self, config_path: str) -> None:
        if self._cap is not None:
            print_warn("Profiler already started. Cannot call start interface while the profiler is active. ",
                        "ERROR")
            return
        raw: Any = None
        for cand in (config_path, os.path.join(self.path or "", CFG_FILE)):
            try:
                with open(cand, encoding="utf-8") as f:
                    raw = json.load(f)
                break
            except (OSError, ValueError):
                continue
        lg = self.log or _make_logger(tempfile.gettempdir(), f"dp_{self.host}_{os.getpid()}_rank_{self.rank}.log")
        ctx = ConfigContext({**(raw if isinstance(raw, dict) else {}), "is_valid": True}, self.rank, lg)
        ctx.is_rank = False
        self._start_capture(ctx)

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            print_warn("Dynamic profiler state_step must be dict.", "ERROR")
            return
        n = state.get("cur_step", 0)
        if not isinstance(n, int) or n < 0:
            print_warn("Dynamic profiler cur_step must be a non-negative integer.", "ERROR")
            return
        self.cur_step = n

    def record_segment(self, kind: str, start_ns: int, end_ns: int, name: str | None = None, wait_ns: int = 0) -> None:
        """NOT torch_npu: feed a measured compute/collective interval (unix ns) of the running capture.

        ``wait_ns`` (collectives): the part spent waiting for the last peer to arrive; the rest is the transfer.
        """
        if kind not in ("compute", "collective"):
            raise ValueError(f"kind must be 'compute' or 'collective', got {kind!r}")
        cap = self._cap
        if cap is not None:
            cap.segments.append((kind, int(start_ns), int(end_ns), name, max(0, int(wait_ns))))

    # -- monitor -----------------------------------------------------------------------------------------------
    def _monitor_loop(self, cfg: str, last: int) -> None:
        assert self._mlog is not None
        while not self._stop.is_set():
            try:
                if not os.path.exists(cfg):
                    self._mlog.error("Dynamic profiler cfg json not exists")
                else:
                    m = int(os.path.getmtime(cfg))
                    if m != last:
                        last = m
                        self._load(cfg, m)
            except OSError:
                pass
            self._stop.wait(self._fixed if self._fixed is not None else self._interval)

    def _load(self, cfg: str, m: int) -> None:
        assert self._mlog is not None
        if os.path.getsize(cfg) > MAX_BYTES:
            self._mlog.warning("Load json failed,  because cfg bytes size over %d bytes", MAX_BYTES)
            return
        try:
            with open(cfg, encoding="utf-8") as f:
                data = f.read()
            raw = json.loads(data) if data else {}
            raw["is_valid"] = True  # what torch_npu's monitor adds (a JSON list fails right here, as in torch_npu)
            self._mlog.info("Dynamic profiler process load json success")
        except (OSError, ValueError, TypeError) as exc:
            self._mlog.error("Dynamic profiler process load json failed, %s has occur!", exc)
            raw = {"is_valid": False}
        self._shm = (m, raw)

    # -- capture ----------------------------------------------------------------------------------------------
    def _start_capture(self, ctx: ConfigContext) -> None:
        work = os.environ.get("ASCEND_WORK_PATH")
        default = os.path.join(os.path.abspath(work), "profiling_data") if work else os.getcwd()
        prof_dir = os.path.realpath(os.path.expanduser(ctx.prof_dir)) if ctx.prof_dir else default
        now = time.time()
        lt = time.localtime(now)
        name = f"{self.host}_{os.getpid()}_{time.strftime('%Y%m%d%H%M%S', lt)}{int(now * 1000) % 1000:03d}_ascend_pt"
        rank_dir = os.path.join(prof_dir, name)
        os.makedirs(os.path.join(rank_dir, "FRAMEWORK"), mode=0o750, exist_ok=True)
        os.chmod(rank_dir, 0o750)
        self._cap = _Capture(ctx, self.cur_step, rank_dir)
        if self.log:
            self.log.info("Start Dynamic Profiler at %d step.", self.cur_step)

    def _stop_capture(self) -> None:
        cap = self._cap
        if cap is None:
            return
        self._cap = None
        ctx = cap.ctx
        first = cap.start_step + cap.warmup
        recorded = [k for k in range(first, first + cap.active) if k + 1 in cap.step_marks]
        flags = {k: ctx.flags[k] for k in ("record_shapes", "profile_memory", "with_stack", "with_flops",
                                           "with_modules")}
        info: dict[str, Any] = {  # torch_npu's profiler_interface._dump_profiler_info shape (indent 4)
            "config": {"common_config": {"activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                                         "schedule": {"wait": 0, "active": cap.active, "warmup": cap.warmup,
                                                      "repeat": 1, "skip_first": 0, "skip_first_wait": 0},
                                         **flags},
                       "experimental_config": {"_profiler_level": ctx.level, "_export_type": ctx.export_type}},
            "start_info": {"syscnt_enable": False, "freq": 100, "start_cnt": 0, "start_monotonic": cap.start_mono_ns},
            "end_info": {"collectionTimeEnd": time.time_ns(), "MonotonicTimeEnd": time.monotonic_ns()},
            "torch_npu_version": FAKE_VERSION, "cann_version": "simulated",
            "profwatch_sim": {"steps": recorded, "start_step": cap.start_step},
        }
        env_rank = os.environ.get("RANK")
        if env_rank is not None:
            info["rank_id"] = env_rank  # torch_npu writes the RANK string as it is
        fname = f"profiler_info_{env_rank}.json" if env_rank is not None else "profiler_info.json"
        _write_json(os.path.join(cap.rank_dir, fname), info, indent=4)
        meta = dict(ctx.metadata)
        if "text" in ctx.export_type:
            meta["ENV_VARIABLES"] = {k: os.environ.get(k, "") for k in _ENV_VARIABLES}
        world = _world_size()
        if world > 1 and self.rank >= 0:  # torch_npu adds the HCCL groups when torch.distributed runs on HCCL
            meta["parallel_group_info"] = {_group_name(): {"group_name": "default_group", "group_rank": self.rank,
                                                           "global_ranks": list(range(world))}}
        meta["trace_id"] = uuid.uuid4().hex.upper()
        _write_json(os.path.join(cap.rank_dir, "profiler_metadata.json"), meta)
        if ctx.analyse:
            if ctx.async_mode:
                t = threading.Thread(target=self._parse, args=(cap, recorded, meta), name="sim-dp-parse")
                self._parses.append(t)
                t.start()
                if self.log:
                    self.log.info("Stop Dynamic Profiler at %d step.", self.cur_step)
                return
            self._parse(cap, recorded, meta)
        if self.log:
            self.log.info("Stop Dynamic Profiler at %d step.", self.cur_step)

    def _parse(self, cap: _Capture, recorded: list[int], meta: dict[str, Any]) -> None:
        """Recreate ``ASCEND_PROFILER_OUTPUT/`` from the generator, then ``analyse.done`` last."""
        from profwatch.simulate.ascend_tree import (
            CollectiveSegment,
            ComputeSegment,
            ParallelGroup,
            RankTimeline,
            StepTimeline,
            write_rank_dir,
        )

        out = os.path.join(cap.rank_dir, "ASCEND_PROFILER_OUTPUT")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out, mode=0o750)
        world = _world_size()
        rank = max(self.rank, 0)
        group = ParallelGroup(_group_name(), "default_group", tuple(range(world)))
        steps = []
        for k in recorded:
            t0, t1 = cap.step_marks[k], cap.step_marks[k + 1]
            segs: list[Any] = []
            mine = sorted(s for s in cap.segments if t0 <= s[1] < t1)
            if not mine:
                span = max(t1 - t0, 1000)
                cuts = [0.02, 0.40, 0.50, 0.88, 0.98]
                p = [t0 + int(span * c) for c in cuts]
                mine = [("compute", p[0], p[1], None, 0), ("collective", p[1], p[2], None, 0),
                        ("compute", p[2], p[3], None, 0), ("collective", p[3], p[4], None, 0)]
            ci = 0
            for kind, s0, s1, nm, wait in mine:
                if kind == "compute":
                    segs.append(ComputeSegment(s0, max(s1, s0 + 1)))
                else:
                    dur = max(s1, s0 + 1) - s0
                    w = min(wait, dur - 1)
                    # the link carried data only after the last peer arrived: transit = duration - wait
                    segs.append(CollectiveSegment(s0, s0 + dur, nm or f"hcom_allReduce__{k}{ci:02d}_0_1",
                                                  group.raw_name, wait_ns=w, link_transit_ns=dur - w))
                    ci += 1
            steps.append(StepTimeline(k, t0, t1, tuple(segs)))
        tl = RankTimeline(rank=rank, world_size=world, hostname=self.host, pid=os.getpid(), steps=steps,
                          start_ns=cap.start_ns, groups=[group] if world > 1 else [], level=cap.ctx.level)
        et: Literal["db", "text", "both"] = (
            "both" if set(cap.ctx.export_type) >= {"text", "db"} else ("db" if "db" in cap.ctx.export_type else "text"))
        tmp = tempfile.mkdtemp(prefix="pw-sim-parse-")
        try:
            gen = write_rank_dir(Path(tmp), tl, export_type=et, with_marker=False, metadata=meta)
            for entry in os.listdir(gen / "ASCEND_PROFILER_OUTPUT"):
                shutil.move(str(gen / "ASCEND_PROFILER_OUTPUT" / entry), os.path.join(out, entry))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        done = os.path.join(out, "analyse.done")
        with open(done, "wb"):
            pass
        os.chmod(done, 0o640)

    def _exit(self) -> None:
        if self._cap is not None:
            if self.rank in (-1, 0):
                print_warn("Profiler stop when process exit, check cfg json active whether over all step!")
            self._stop_capture()
        for t in self._parses:
            t.join()
        self._stop.set()
        if self.log:
            self.log.info("Rank %d unlink shm", self.rank)
        if self._mlog:
            self._mlog.info("Dynamic profiler process done")


def _write_json(path: str, obj: Any, indent: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)


_ENV_VARIABLES = ("ASCEND_GLOBAL_LOG_LEVEL", "HCCL_RDMA_TC", "HCCL_RDMA_SL", "ACLNN_CACHE_LIMIT", "HOST_CACHE_CAPACITY",
                  "ASCEND_ENHANCE_ENABLE", "PYTORCH_NPU_ALLOC_CONF", "ASCEND_LAUNCH_BLOCKING", "HCCL_ALGO")
"""The environment torch_npu records in ``profiler_metadata.json`` for a text export (``collect_env_vars``)."""


def _world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def _group_name() -> str:
    """The simulated job's HCCL default-group communicator name, the same on every rank of one job."""
    from profwatch.simulate.ascend_tree import default_group_name

    job = os.environ.get("PROFWATCH_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or ""
    return default_group_name(int.from_bytes(job.encode()[:6].ljust(6, b"\0"), "big") * 1000)


_SIM = DynamicProfileSim()


def _wrap(fn_name: str):  # type: ignore[no-untyped-def]
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(_SIM, fn_name)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - torch_npu swallows and prints ("Call step failed")
            print(f"Call {fn_name} failed. Exception: {exc}", flush=True)
            return None

    call.__name__ = fn_name
    return call


init = _wrap("init")
step = _wrap("step")
start = _wrap("start")
set_state = _wrap("set_state")


def record_segment(kind: str, start_ns: int, end_ns: int, name: str | None = None, wait_ns: int = 0) -> None:
    """NOT part of torch_npu: give the simulator a measured segment (``kind`` ``compute`` | ``collective``)."""
    _SIM.record_segment(kind, start_ns, end_ns, name, wait_ns)
