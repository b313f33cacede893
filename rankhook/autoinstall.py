"""Zero-intrusion mode: ``PROFWATCH=1`` installs rankhook at interpreter start and steps on optimizer steps (stdlib).

How: :func:`install_pth` writes ``profwatch.pth`` into a site-packages dir; Python's ``site`` module runs its one
``import`` line at every interpreter start, which calls :func:`maybe_autoinstall`. That does nothing unless
``PROFWATCH=1`` is in the environment. Then, as soon as ``torch.optim.optimizer`` is imported (torch is never
imported by profwatch itself), it registers torch's **global** optimizer-step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``), calls ``rankhook.init()`` at the first optimizer
step and ``rankhook.step()`` once per iteration.

Install once per Python environment: ``python -m rankhook.autoinstall --install`` (``--uninstall`` to remove,
``--site-dir DIR`` / ``--user`` for another target); it prints the file it wrote.

Step counting mirrors torch_npu's PROF_CONFIG_PATH mode (docs/torch_npu-dynamic-profile.md#step-counting): a per-optimizer step counter (weak dict) and a ``step()`` only when some optimizer's count exceeds the highest
count seen so far, so several optimizers stepping once per iteration make one step.

Limits (documented, same as torch_npu's): no step 0 (the first ``step()`` happens after the first optimizer step,
so the earliest capture covers iteration 1; iteration 1 sends no step report: the hook starts at its end, so
that interval is not a step, ``Hook.untimed_first_step``); custom optimizers that bypass ``Optimizer.step`` hooks never step;
creating a new optimizer instance mid-run stalls stepping until its own count exceeds the old maximum;
iterations that skip ``optimizer.step()`` (AMP overflow) are not counted; training only (no inference). Do not
combine with explicit ``rankhook.step()`` calls (double counting) or with torch_npu's ``PROF_CONFIG_PATH``.
"""

from __future__ import annotations

import argparse
import logging
import os
import site
import sys
import sysconfig
import weakref
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("rankhook")

PTH_NAME = "profwatch.pth"
PTH_LINE = ("import os; os.environ.get('PROFWATCH', '').strip() == '1' and "
            "__import__('rankhook.autoinstall', fromlist=['maybe_autoinstall']).maybe_autoinstall()\n")
"""What ``profwatch.pth`` runs at every interpreter start: nothing but an env read without ``PROFWATCH=1`` (no
import of this module: no start-up cost, and ``python -m rankhook.autoinstall`` run without it does not warn that it
found itself imported)."""
ENV_FLAG = "PROFWATCH"


class OptimizerStepCounter:
    """torch_npu's optimizer-step counting: one ``on_step`` per iteration however many optimizers step.

    ``on_optimizer_step(opt)`` returns True when the caller should advance one step.
    """

    def __init__(self) -> None:
        self._counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._max = 0

    def on_optimizer_step(self, opt: Any) -> bool:
        n = self._counts.get(opt, 0) + 1
        self._counts[opt] = n
        if n > self._max:
            self._max = n
            return True
        return False


class _Installer:
    """State of the auto-installed hook in this process (created once by :func:`maybe_autoinstall`)."""

    def __init__(self) -> None:
        self.counter = OptimizerStepCounter()
        self.inited = False
        self.handle: Any = None

    def hook(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            import rankhook

            if not self.inited:
                self.inited = True
                fresh = rankhook.current() is None
                hook = rankhook.init()
                if fresh and hook is not None:  # its first interval is init's own set-up, not an iteration
                    hook.untimed_first_step()
            if self.counter.on_optimizer_step(opt):
                rankhook.step()
        except Exception as exc:  # noqa: BLE001 - never raise into the training loop
            log.warning("rankhook autoinstall: step hook failed: %r", exc)

    def register(self) -> bool:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except Exception as exc:  # noqa: BLE001
            log.warning("rankhook autoinstall: torch optimizer hooks unavailable: %r", exc)
            return False
        self.handle = register_optimizer_step_post_hook(self.hook)
        return True


_INSTALLER: _Installer | None = None


class _TorchOptimFinder:
    """Meta-path finder that registers the hook right after ``torch.optim.optimizer`` is imported (lazy)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch.optim.optimizer":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            orig_exec(module)
            if _INSTALLER is not None:
                _INSTALLER.register()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def maybe_autoinstall() -> bool:
    """Entry point of ``profwatch.pth``: with ``PROFWATCH=1``, arrange the optimizer-step hook; never raises.

    If ``torch.optim.optimizer`` is already imported the hook is registered now, otherwise when it is imported
    (torch itself is never imported by this function). Returns True when installed or scheduled.
    """
    global _INSTALLER
    try:
        if os.environ.get(ENV_FLAG, "").strip() != "1" or _INSTALLER is not None:
            return False
        if os.environ.get("PROF_CONFIG_PATH", "").strip():
            log.warning("rankhook autoinstall: PROF_CONFIG_PATH is set (torch_npu steps itself); not installing")
            return False
        _INSTALLER = _Installer()
        if "torch.optim.optimizer" in sys.modules:
            return _INSTALLER.register()
        sys.meta_path.insert(0, _TorchOptimFinder())
        return True
    except Exception as exc:  # noqa: BLE001
        log.warning("rankhook autoinstall failed: %r", exc)
        return False


def default_site_dir() -> str:
    """The purelib site-packages dir of the running interpreter (venv-aware)."""
    return sysconfig.get_paths()["purelib"]


def install_pth(site_dir: str | None = None) -> str:
    """Write ``profwatch.pth`` into ``site_dir`` (default: this interpreter's site-packages); return its path.

    The .pth only runs :func:`maybe_autoinstall`, which is inert without ``PROFWATCH=1``. Written to a temporary
    name and renamed, so a Python starting meanwhile never reads half a line. Raises OSError (e.g. the folder is
    not writable or does not exist).
    """
    d = site_dir or default_site_dir()
    path = os.path.join(d, PTH_NAME)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(PTH_LINE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def uninstall_pth(site_dir: str | None = None) -> bool:
    """Remove ``profwatch.pth`` from ``site_dir``; True if it was there."""
    path = os.path.join(site_dir or default_site_dir(), PTH_NAME)
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return False


EXIT_OK = 0
EXIT_USAGE = 2  # the same code as daemon/profwatch/exitcodes.py EXIT_USAGE (rankhook never imports daemon)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rankhook.autoinstall --install | --uninstall [--site-dir DIR | --user]``: write or remove
    ``profwatch.pth``, print what was done. Returns 0, or 2 when the file cannot be written or removed."""
    ap = argparse.ArgumentParser(prog="python -m rankhook.autoinstall",
                                 description="Install the profwatch .pth hook: with PROFWATCH=1 in a training "
                                             "process's environment, rankhook steps on optimizer steps.")
    action = ap.add_mutually_exclusive_group(required=True)
    action.add_argument("--install", action="store_true", help="write profwatch.pth into site-packages")
    action.add_argument("--uninstall", action="store_true", help="remove profwatch.pth from site-packages")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--site-dir", help="target folder (default: this interpreter's site-packages)")
    where.add_argument("--user", action="store_true", help="the user site-packages (site.getusersitepackages())")
    args = ap.parse_args(argv)
    site_dir = args.site_dir or (site.getusersitepackages() if args.user else default_site_dir())
    try:
        if args.install:
            if args.user:
                os.makedirs(site_dir, exist_ok=True)
            path = install_pth(site_dir)
            print(f"wrote {path}")
            print(f"  it runs: {PTH_LINE.strip()}")
            print(f"  inert unless the training process runs with {ENV_FLAG}=1 (remove: python -m "
                  "rankhook.autoinstall --uninstall)")
        elif uninstall_pth(site_dir):
            print(f"removed {os.path.join(site_dir, PTH_NAME)}")
        else:
            print(f"nothing to remove: no {PTH_NAME} in {site_dir}")
    except OSError as exc:
        print(f"rankhook.autoinstall: cannot {'write' if args.install else 'remove'} {PTH_NAME} in {site_dir}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
