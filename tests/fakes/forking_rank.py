"""A rank process that forks children which call rankhook (tests of issue 11 item 7: a child never speaks as
its parent). stdlib + rankhook; torch only in the ``dataloader`` mode.

Usage: python forking_rank.py MODE OUT_DIR  (MODE: os_fork | mp_fork | dataloader; identity and endpoint from the
environment). The parent steps 20 times, lets its children call rankhook (30 steps each, plus init, set_step,
flag_step and a stage), steps 20 more times, shuts down and writes OUT_DIR/parent.json
``{"pid", "steps", "sent"}``. Each child writes OUT_DIR/child-<pid>.json ``{"pid", "forked_child",
"init_is_parent_hook", "sent_before", "sent_after"}``; DataLoader workers return the same per item.
"""

import json
import multiprocessing
import os
import sys
import time

import rankhook

MODE, OUT = sys.argv[1], sys.argv[2]
STEP_S = 0.01


def child_work() -> dict:
    hook = rankhook.current()
    before = hook.publisher.counters.sent if hook is not None else -1
    again = rankhook.init()  # a child calling init gets the silenced parent hook, not a new identity
    for _ in range(30):
        with rankhook.stage("io"):
            pass
        rankhook.flag_step("data")
        rankhook.step()
    rankhook.set_step(5)
    after = hook.publisher.counters.sent if hook is not None else -1
    return {"pid": os.getpid(), "forked_child": bool(hook is not None and hook.forked_child),
            "init_is_parent_hook": again is hook, "sent_before": before, "sent_after": after}


def write_child() -> None:
    res = child_work()
    with open(os.path.join(OUT, f"child-{os.getpid()}.json"), "w") as f:
        json.dump(res, f)


class Items:
    """A map-style dataset whose __getitem__ (run in DataLoader worker processes) calls rankhook."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return child_work()


def main() -> None:
    hook = rankhook.init(backend="none")
    assert hook is not None
    steps = 0

    def step() -> None:
        nonlocal steps
        time.sleep(STEP_S)  # the simulated step's work (not a test wait)
        rankhook.step()
        steps += 1

    for _ in range(20):
        step()
    if MODE == "os_fork":
        pid = os.fork()
        if pid == 0:
            write_child()
            sys.exit(0)  # runs atexit (rankhook.shutdown) in the child: still no bye for the parent's rank
        os.waitpid(pid, 0)
    elif MODE == "mp_fork":
        p = multiprocessing.get_context("fork").Process(target=write_child)
        p.start()
        p.join(60)
    elif MODE == "dataloader":
        from torch.utils.data import DataLoader

        loader: DataLoader = DataLoader(Items(), batch_size=None, num_workers=2,  # type: ignore[arg-type]
                                        multiprocessing_context="fork")
        for item in loader:
            with open(os.path.join(OUT, f"child-{item['pid']}-{steps}.json"), "w") as f:
                json.dump(item, f)
            step()  # the parent trains on each item while its workers keep calling rankhook
    else:
        raise SystemExit(f"unknown mode {MODE}")
    for _ in range(20):
        step()
    rankhook.shutdown()
    with open(os.path.join(OUT, "parent.json"), "w") as f:
        json.dump({"pid": os.getpid(), "steps": steps, "sent": hook.publisher.counters.sent}, f)


if __name__ == "__main__":
    main()
