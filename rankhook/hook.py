"""The per-process hook: times steps and stages, publishes them, drives the capture backend (stdlib + pyzmq).

Hot path: :meth:`Hook.step` builds the step report JSON by one bytes %-format of integers (the field order of
:class:`rankhook.wire.StepReportUs`; the clocks are read in integer nanoseconds), sends it with one non-blocking
ZeroMQ call and hands the step to the capture backend (none for the ``none`` backend, whose calls do nothing). One
comparison decides that the hook is open and the caller owns the step counter. It never raises and never blocks the
training loop (``bench/bench_step_python.py`` measures its own Python per call).

CPU time: ``step()`` reads no CPU clock on its own. The hook's sampler thread (``Hook._sampler_loop``, one per
hook, training and serving) asks for a CPU sample every :data:`CPU_SAMPLE_S` (0.25 s) while the rank steps, by
putting a :class:`_CpuProbe` in front of the capture backend (the step path's existing ``capture is not None``
check: nothing is added to it). At the end of the next step the probe reads the process's CPU time
(``time.process_time_ns()``, every thread of the process) on the owner thread, so the sample falls on a step
boundary, and the next report carries it (``cpu_at_step``, ``cpu_total_us``: the step formats rebuilt with the
pair as two constant fields, then without it). The coordinator divides the CPU time between two samples by the
steps between them (``docs/detection.md``, CPU time per step) to compare lockstep ranks at like host load. The
process, not the step thread (``time.thread_time_ns()``): the work a step does is spread over the rank's threads
(torch's intra-op pool, a pin-memory or tokenizer thread, the comm library's threads), and the owner thread's
share of it moves with scheduling; a peer waiting in a blocking collective (gloo) sleeps in every thread, so its
process time does not grow with the wait. Forked DataLoader workers are processes of their own and counted by
neither. The read is a system call that sums every thread of the process (on this VM about 1 us with 50 threads,
24.6 us with 1,000): in one step every 0.25 s. Before, ``step()`` read it at the end of each step of 1 ms or
more and sent ``cpu_us`` per step, which cost every call one comparison (``bench/bench_step_python.py``:
1,013-1,029 ns against 966-984 ns without it).

Forked children: a child of a rank (``os.fork``, multiprocessing's ``fork`` start method, a DataLoader worker)
inherits the rank's hook, identity and step counter. It must never speak as its parent: one step report from it
would make the coordinator see the rank's step counter jump and then go back, i.e. a restart that wipes the
rank's history. So every live hook is silenced in the child right after the fork (``os.register_at_fork``):
``step``, ``emit``, ``set_step`` and the hello do nothing there, the backend is left alone (its threads and
profiler state belong to the parent) and nothing is sent, not even a ``bye``. A process that is a rank of its
own is started with exec/spawn (torchrun, ``mp.spawn``) and initialises rankhook afresh.

Threads: the *owner* of the step counter is the thread named at construction (``step_thread``: ``rankhook.init``
names the thread that called it, or the one its ``step_thread`` argument names; the zero-code hook calls ``init`` at
the first optimizer step, so that is the training thread, also in a worker thread), else the thread that first
called :meth:`Hook.step`. A side thread that calls ``step()`` before the training loop does never takes the counter
(its cadence would become the step time and the profiler would be started from it: Kineto refuses a thread other
than the one that registered it). A ``step()`` from any other thread is dropped (one warning per hook, counted in ``foreign_steps``): it neither advances the counter nor
reaches the capture backend, so the profiler is started and stepped only from the owner thread and the counter
never goes back or jumps because two threads share it. ``set_step`` and ``rankhook.start()`` from another thread
are refused the same way once the owner is known. ``stage()`` and ``flag_step()`` may be called from any thread.

Serving mode (``mode="serving"``): the same thread also re-sends the hello while the rank has not stepped for
``wire.KEEPALIVE_S`` (a keepalive), so an idle server stays known (its job is not ended, its ranks are not gone).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from rankhook import wire
from rankhook.identity import Identity
from rankhook.publisher import Publisher

if TYPE_CHECKING:
    from rankhook.backends.base import CaptureBackend

log = logging.getLogger("rankhook")

HELLO_RESEND_S = 10.0
"""The hello is re-sent this often, so a restarted node daemon learns its ranks without a rank restart."""
_HELLO_RESEND_NS = int(HELLO_RESEND_S * 1e9)


_get_ident = threading.get_ident
_perf_counter_ns = time.perf_counter_ns
_process_time_ns = time.process_time_ns
CPU_SAMPLE_S = 0.25
"""The sampler thread asks for a sample of the process's CPU time and the step count this often while the rank
steps (module docstring); the coordinator's CPU time per step is the mean over the steps between two samples (at
least ``aggregation.CPU_SAMPLE_MIN_STEPS``). Four reads a second, one costing 1-25 us (50-1,000 threads), each in
one step. Once a second lagged the comparison by a second: +30 % on one rank of a simulated lockstep job (about 57
steps a second, 2, 4 and 8 ranks, 8 seeds) was named 44-101 steps after its onset, at 0.25 s 16-53
(``tests/unit/test_cpu_time.py``)."""
_time_ns = time.time_ns
"""The clocks and the thread id, bound once: ``rankhook.step()`` looks up no module attribute for them."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_LIVE_HOOKS: weakref.WeakSet[Hook] = weakref.WeakSet()


def _silence_hooks_after_fork() -> None:
    """``os.register_at_fork(after_in_child=...)``: a forked child never speaks as its parent's rank."""
    for hook in list(_LIVE_HOOKS):
        hook.silence_forked_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_silence_hooks_after_fork)


def _safe_stage_name(name: str) -> str:
    """``name`` with anything outside ``[A-Za-z0-9_.:-]`` replaced by ``_``, cut to 64 characters."""
    return _UNSAFE.sub("_", name)[:64] or "_"


class _Stage:
    """Context manager that adds its wall duration to ``hook._stages[name]`` (``rankhook.stage``)."""

    __slots__ = ("_hook", "_name", "_t0")

    def __init__(self, hook: Hook, name: str) -> None:
        self._hook = hook
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> _Stage:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        dt = time.perf_counter() - self._t0
        stages = self._hook._stages
        stages[self._name] = stages.get(self._name, 0.0) + dt


class _CpuProbe:
    """Put in front of the capture backend (``Hook._capture``) by the sampler thread to take one CPU sample on a step
    boundary, on the owner thread, where the step path already calls the backend: at the end of the next step
    (:meth:`after_step`, after its report was sent) it reads the process's CPU time and puts the pair into the
    step formats, so the next report carries it; at the end of that one it takes it out and steps aside. Between
    samples the step path is the backend's own (none: no call at all). ``capturing`` and ``after_step`` pass on to
    the hook's backend of the moment (``Hook._real_capture``: one replaced meanwhile is not brought back)."""

    __slots__ = ("_hook", "_read", "name")

    def __init__(self, hook: Hook) -> None:
        self._hook = hook
        self._read = False
        self.name = hook.backend.name

    def capturing(self) -> bool:
        inner = self._hook._real_capture()
        return inner is not None and inner.capturing()

    def after_step(self, step: int) -> None:
        hook = self._hook
        if not self._read:
            self._read = True
            cpu_us = _process_time_ns() // 1000
            hook._set_formats(f',"cpu_at_step":{step:d},"cpu_total_us":{cpu_us:d}')
        else:
            hook._set_formats("")
            if hook._capture is self:
                hook._capture = hook._real_capture()
        inner = hook._real_capture()
        if inner is not None:
            inner.after_step(step)


class Hook:
    """State of rankhook in one process.

    Args:
        ident: this rank's identity.
        publisher: where messages go.
        backend: the capture backend (``none`` when capture is off).
        profiler_config_path: folder of ``profiler_config.json`` announced in the hello.
        prof_root: where captures land, announced in the hello.
        mode: ``training`` | ``serving`` | None (not said); sent in the hello and every step report.
        role: label of the ranks doing the same work (e.g. ``pp1``), made safe like a stage name; None: not said.
        step_thread: the thread that owns the step counter (module doc; it may start later); None: the first
            thread that calls :meth:`step`.
    """

    def __init__(
        self,
        ident: Identity,
        publisher: Publisher,
        backend: CaptureBackend,
        profiler_config_path: str | None = None,
        prof_root: str | None = None,
        versions: dict[str, str] | None = None,
        mode: str | None = None,
        role: str | None = None,
        step_thread: threading.Thread | None = None,
    ) -> None:
        self.ident = ident
        self.publisher = publisher
        self.backend = backend
        self.step_count = 0
        self._stages: dict[str, float] = {}
        self._stage_names: dict[str, str] = {}
        self._flags: list[str] = []
        self._hello = wire.RankHello(
            job_id=ident.job_id,
            rank=ident.rank,
            local_rank=ident.local_rank,
            world_size=ident.world_size,
            hostname=ident.hostname,
            pid=ident.pid,
            backend=backend.name,  # type: ignore[arg-type]
            ts_unix_s=time.time(),
            versions=versions or {},
            profiler_config_path=profiler_config_path,
            prof_root=prof_root,
            restart_count=ident.restart_count,
            mode=mode,
            role=role,
        )
        self.mode = mode
        self.role = role
        self._topic_step = wire.topic_for("step", ident.job_id, ident.rank).encode()
        self._prefix = (
            '{"job_id":' + json.dumps(ident.job_id) + ',"rank":' + str(ident.rank) + ',"step":'
        )
        labels = (',"mode":' + json.dumps(mode) if mode else "") + (',"role":' + json.dumps(role) if role else "")
        self._suffix = labels + ',"kind":"step","v":' + str(wire.SCHEMA_VERSION) + "}"  # wire.StepReportUs
        self._step_format = b""
        """The step report without optional fields: step, step_time_us, ts_unix_us (and a CPU sample's two
        constant fields while the sampler has one to carry: :meth:`_set_formats`)."""
        self._step_format_tail = b""
        """The same with the optional fields (bytes, :meth:`_tail`) after ``ts_unix_us``."""
        self._set_formats("")
        self._closed = False
        self._step_owner = 0
        """The owner's ``threading.get_ident()`` once :meth:`step` has seen it, 0 before and once closed: the step
        path's one check for both (``_closed`` and ``_owner`` stay the truth; the slow path re-checks them)."""
        self.forked_child = False
        """True in a forked child of the rank: the hook is silent there (module docstring)."""
        self._owner_thread = step_thread
        self._owner: int | None = step_thread.ident if step_thread is not None else None
        """``threading.get_ident()`` of the thread that owns the step counter (``step_thread``, else the first to
        call ``step()``); None until known (a named thread not started yet)."""
        self._owner_lock = threading.Lock()
        self.foreign_steps = 0
        """``step()`` calls dropped because they came from a thread other than the owner."""
        self._warned: set[str] = set()
        self._t_hello = 0.0  # perf_counter() of the last hello sent
        _LIVE_HOOKS.add(self)
        self.send_hello()
        self._t_last_ns = time.perf_counter_ns()  # perf_counter_ns() of the last step (or of the construction)
        self._untimed_step = False  # the next step's interval is not a step: not reported (untimed_first_step)
        self._next_hello_ns = self._t_last_ns + _HELLO_RESEND_NS
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = threading.Thread(target=self._sampler_loop, name="rankhook-sampler",
                                                                  daemon=True)
        """Asks for CPU samples (and, in serving mode, re-sends the hello while idle): :meth:`_sampler_loop`; None
        in a forked child."""
        self._sampler.start()

    @property
    def backend(self) -> CaptureBackend:
        """The capture backend in use (``none`` when capture is off)."""
        return self._backend

    @backend.setter
    def backend(self, backend: CaptureBackend) -> None:
        self._backend = backend
        # the none backend's after_step() and capturing() do nothing: step() skips both calls for it (~80 ns)
        self._capture: CaptureBackend | _CpuProbe | None = self._real_capture()
        if getattr(self, "_prefix", None):  # a CPU probe replaced: its sample is not carried on
            self._set_formats("")

    def _real_capture(self) -> CaptureBackend | None:
        """The backend the step path calls: None for the ``none`` backend (its calls do nothing)."""
        from rankhook.backends.base import NoneBackend

        backend = self._backend
        return None if type(backend) is NoneBackend else backend

    # -- messages -------------------------------------------------------------------------------------------
    def silence_forked_child(self) -> None:
        """Called in a forked child: from now on this hook sends nothing and drives no backend."""
        self.forked_child = True
        self._closed = True
        self._step_owner = 0  # the child's thread may have the parent's owner's ident
        self._owner_lock = threading.Lock()  # a lock inherited through fork may be held by a thread not there
        self._sampler = None  # the thread does not exist in the child

    def _set_formats(self, sample: str) -> None:
        """Build the two step formats with ``sample`` (``,"cpu_at_step":S,"cpu_total_us":C`` or "") after the fixed
        fields. Called on the owner thread between reports (:class:`_CpuProbe`), and where the backend is replaced;
        each format is replaced whole (one attribute store), so a report carries the sample or not, never half."""
        fixed = self._prefix + '%d,"step_time_us":%d,"ts_unix_us":%d' + sample
        self._step_format = (fixed + self._suffix).encode()
        self._step_format_tail = (fixed + "%s" + self._suffix).encode()

    def _sampler_loop(self) -> None:
        """The hook's thread: a CPU sample about every :data:`CPU_SAMPLE_S` while the rank steps (module doc), and
        in serving mode the hello re-sent while no step came for ``wire.KEEPALIVE_S``. Never raises.

        A sample is asked for by putting a :class:`_CpuProbe` in front of the capture backend (one attribute
        store); the owner thread reads the clock in the probe at the end of its next step, so the sample falls on
        a step boundary (a read at any moment of a step would split that step's CPU time between two intervals at
        random: 5-8 % apart between halves of a 40-step learning window in the rank comparison)."""
        period = wire.KEEPALIVE_S
        serving = self.mode == "serving"
        tick = min(CPU_SAMPLE_S, period / 4) if serving else CPU_SAMPLE_S
        sampled_at = 0  # the step count when the last sample was asked for (none before the first step)
        while not self._stop.wait(tick):
            if self._closed:
                return
            try:
                n = self.step_count
                capture = self._capture
                if n != sampled_at and not isinstance(capture, _CpuProbe):
                    sampled_at = n
                    self._capture = _CpuProbe(self)
                now = time.perf_counter()
                if serving and now - self._t_last_ns / 1e9 >= period and now - self._t_hello >= period:
                    self.send_hello()
            except Exception as exc:  # noqa: BLE001 - the sampler must never take the process down
                self._warn_once("sampler", "rankhook: sampler thread failed: %r", exc)

    def _warn_once(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(msg, *args)

    def owns_steps(self, what: str, *, claim: bool = False) -> bool:
        """True when the calling thread owns the step counter, or nobody does yet (then, with ``claim``, it
        becomes the owner); otherwise warn once per ``what`` and return False."""
        me = threading.get_ident()
        named = self._owner_thread
        with self._owner_lock:
            if self._owner is None:
                if named is not None:
                    if threading.current_thread() is named:
                        self._owner = me
                elif not claim:
                    return True
                else:
                    self._owner = me
            if self._owner == me:
                return True
        why = ("the thread that called rankhook.init(), or its step_thread" if named is not None
               else "it called step() first")
        owner = named.name if named is not None else self._owner
        self._warn_once(what, "rankhook: %s called from thread %s, but thread %s owns the step counter (%s): "
                        "ignored (this warning is shown once)", what, threading.current_thread().name, owner, why)
        return False

    def send_hello(self) -> None:
        """(Re-)announce this rank to the node daemon, with the publisher's counters."""
        if self.forked_child:
            return
        self._t_hello = time.perf_counter()
        c = self.publisher.counters
        counters = {"sent": c.sent, "dropped": c.dropped, "errors": c.errors, "oversize": c.oversize}
        versions = self._hello.versions
        if "torch_npu" not in versions:  # imported after init (its backend opens later): the daemons check its rules
            mod = sys.modules.get("torch_npu")
            if mod is not None and isinstance(getattr(mod, "__version__", None), str):
                versions = {**versions, "torch_npu": mod.__version__}
                self._hello = dataclasses.replace(self._hello, versions=versions)
        hello = dataclasses.replace(self._hello, counters=counters)
        self.publisher.send(*wire.frames(hello))

    def backend_failed(self, error: str) -> None:
        """The capture backend is not usable: run without one and tell the daemons which and why (the hello
        carries ``backend="none"`` and ``backend_error``; ``profwatch status`` shows it)."""
        from rankhook.backends.base import NoneBackend

        self.backend = NoneBackend()
        self._hello = dataclasses.replace(self._hello, backend="none", backend_error=error[:500])
        self.send_hello()

    def emit(self, msg: Any) -> None:
        """Send any wire message (used by capture backends for :class:`~rankhook.wire.CaptureEvent`)."""
        if self.forked_child:
            return
        try:
            self.publisher.send(*wire.frames(msg))
        except Exception as exc:  # noqa: BLE001 - e.g. a non-finite float in a backend event
            self.publisher.counters.errors += 1
            log.warning("rankhook: cannot encode %s: %r", type(msg).__name__, exc)

    def untimed_first_step(self) -> None:
        """The first ``step()``'s interval is not a step: its report is not sent (its step still advances the
        counter and the capture backend). For the zero-code hook (``rankhook/autoinstall.py``), which constructs
        the hook at the end of the first optimizer step, so the interval to its first ``step()`` is the hook's own
        set-up (~1 ms against real steps of ~65 ms), not a training step. No effect once a step was taken."""
        if self.step_count == 0:
            self._untimed_step = True

    # -- hot path -------------------------------------------------------------------------------------------
    def step(self, work: float | None = None) -> None:
        """Mark the end of one training step: publish its duration, advance the capture backend.

        ``work``: the work done in this step (tokens, samples; finite and ``0 <= work <= wire.MAX_WORK``, anything
        else is left out of the report with one warning). A call from a thread other than the owner (module doc)
        is dropped.
        """
        if _get_ident() != self._step_owner and not self._may_step():
            return
        now = _perf_counter_ns()
        dt_ns = now - self._t_last_ns
        self._t_last_ns = now
        step = self.step_count = self.step_count + 1
        capture = self._capture
        try:
            # integer microseconds (wire.StepReportUs), one bytes %-format of integers only: no float repr, no
            # concatenation chain, no float-to-int conversion (the clocks are read in integer nanoseconds).
            capturing = capture is not None and capture.capturing()
            if self._untimed_step:  # the interval since init is not a step (untimed_first_step): no report
                self._untimed_step = False
            elif capturing or self._stages or self._flags or work is not None:
                self.publisher.send(self._topic_step, self._step_format_tail % (
                    step, (dt_ns + 500) // 1000, _time_ns() // 1000, self._tail(work, capturing)))
            else:  # the common step: nothing beyond the fixed fields
                self.publisher.send(self._topic_step,
                                    self._step_format % (step, (dt_ns + 500) // 1000, _time_ns() // 1000))
            if now >= self._next_hello_ns:
                self._next_hello_ns = now + _HELLO_RESEND_NS
                self.send_hello()
        except Exception as exc:  # noqa: BLE001
            self.publisher.counters.errors += 1
            log.warning("rankhook: step report failed: %r", exc)
        if capture is not None:
            try:
                capture.after_step(step)
            except Exception as exc:  # noqa: BLE001 - a broken backend must not break training
                log.warning("rankhook: capture backend %s failed in step(): %r", capture.name, exc)

    def _may_step(self) -> bool:
        """The step path's slow check (the calling thread is not ``_step_owner``): False when the hook is closed or
        the thread does not own the step counter (then the call is counted in ``foreign_steps``)."""
        if self._closed:
            return False
        if not self.owns_steps("step()", claim=True):
            self.foreign_steps += 1
            return False
        self._step_owner = _get_ident()
        if self._closed:  # close() ran meanwhile (from another thread): keep the fast path shut
            self._step_owner = 0
            return False
        return True

    def _tail(self, work: float | None, capturing: bool) -> bytes:
        """The optional fields of this step's report, in :class:`rankhook.wire.StepReportUs` order (``stages``,
        ``flags``, ``capturing``, ``work``), as bytes; takes the step's stages and flags."""
        tail = ""
        if self._stages:
            tail += ',"stages":' + json.dumps(self._stages)
            self._stages = {}
        if self._flags:
            tail += ',"flags":' + json.dumps(self._flags)
            self._flags = []
        if capturing:
            tail += ',"capturing":true'
        if work is not None:
            tail += self._work_field(work)
        return tail.encode()

    def _work_field(self, work: float) -> str:
        """``,"work":<w>`` for a usable ``work`` value, else "" (with one warning)."""
        try:
            w = float(work)
        except (TypeError, ValueError):
            w = math.nan
        if 0.0 <= w <= wire.MAX_WORK:
            return ',"work":' + repr(w)
        self._warn_once("work", "rankhook: step(work=%r) left out of the report: work must be a finite number "
                        "in [0, %g] (this warning is shown once)", work, wire.MAX_WORK)
        return ""

    def stage(self, name: str) -> _Stage:
        """Return a context manager timing one stage of the current step (durations add up per step).

        Names are made safe for the wire once (letters, digits, ``_ . : -``, at most 64 characters); beyond 32
        distinct names in one step the rest are added up under ``other``.
        """
        safe = self._stage_names.get(name)
        if safe is None:
            safe = _safe_stage_name(name)
            if len(self._stage_names) < 1024:
                self._stage_names[name] = safe
        if safe not in self._stages and len(self._stages) >= 31:
            safe = "other"
        return _Stage(self, safe)

    def flag_step(self, flag: str) -> None:
        """Mark the current step (e.g. ``checkpoint``, ``eval``) so detectors exclude it."""
        flag = _safe_stage_name(str(flag))
        if flag not in self._flags and len(self._flags) < 8:
            self._flags.append(flag)

    def set_step(self, step: int) -> None:
        """Align the step counter after a resume (``dp.set_state({"cur_step": step})``); bad values are ignored."""
        if self.forked_child or not self.owns_steps("set_step()"):
            return
        try:
            value = int(step)
            if not 0 <= value < 2**62:
                raise ValueError(f"step must be in [0, 2**62), got {value}")
            self.step_count = value
            # a CPU sample read before the jump and not yet carried would reach the next report with a count past
            # its step (refused whole by the daemons: cpu_at_step <= step) or one the counter no longer counts
            self._set_formats("")
            self.backend.set_step(value)
        except Exception as exc:  # noqa: BLE001 - never raise into the training loop
            log.warning("rankhook: set_step(%r) ignored: %r", step, exc)

    def close(self) -> None:
        """Send a bye, close the backend (bounded wait for a capture flush) and the publisher."""
        if self._closed:
            return
        self._closed = True
        self._step_owner = 0
        if os.getpid() != self.ident.pid:
            return  # a child forked without at-fork hooks (C fork): never a bye for, or a close of, the parent's
        self._stop.set()
        ka = self._sampler
        if ka is not None and ka is not threading.current_thread():
            ka.join(2.0)
        try:
            self.backend.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("rankhook: backend close failed: %r", exc)
        self.publisher.send(
            *wire.frames(
                wire.RankBye(job_id=self.ident.job_id, rank=self.ident.rank, step=self.step_count, ts_unix_s=time.time())
            )
        )
        self.publisher.close(linger_ms=200)
