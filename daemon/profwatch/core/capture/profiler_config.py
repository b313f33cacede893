"""The ``profiler_config.json`` model: what profwatch writes for torch_npu's dynamic_profile (pure; no I/O).

:class:`ProfilerConfig` mirrors torch_npu's ``profiler_config.json``: keys, types, defaults (the template the
monitor writes) and the ``experimental_config`` members. Where torch_npu would *reset* or ignore a value, the
model **refuses** it with :class:`InvalidProfilerConfig`, and the message quotes what torch_npu itself logs for
that value (:data:`TORCH_NPU_SAYS`), so an operator who reads a refusal and torch_npu's log reads one reason.

Source: torch-npu 2.13.0, ``torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_config_context.py``
(``ConfigContext``), ``experimental_config.py`` (``_ExperimentalConfig._check_params``),
``profiler_interface.py`` (``_ProfInterface._check_params``), ``profiler.py`` (``tensorboard_trace_handler``,
``add_metadata_json``) and ``dynamic_profile.py`` (``step``). Every quoted message and every refusal is checked
against those real files by ``tests/conformance/test_config_model.py`` (``docs/conformance.md``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

MAX_CONFIG_BYTES = 1048576
"""torch_npu skips a config over 1 MiB ("Load json failed, because cfg bytes size over 1048576 bytes")."""
MAX_METADATA_VALUE_CHARS = 4096
MAX_METADATA_TOTAL_CHARS = 50_000
"""``add_metadata_json`` limits: key and JSON value <= 4096 characters each; the whole metadata < ~50 KB."""

ProfilerLevel = Literal["Level_none", "Level0", "Level1", "Level2"]
AicMetrics = Literal[
    "AiCoreNone", "PipeUtilization", "ArithmeticUtilization", "Memory", "MemoryL0", "MemoryUB",
    "ResourceConflictRatio", "L2Cache", "MemoryAccess",
]
ExportType = Literal["text", "db"]
HostSys = Literal["cpu", "mem", "disk", "network", "osrt", "numa"]

NOT_EFFECTIVE = "Dynamic Profiler config is not effective"
"""torch_npu's warning (rank 0 stdout) for a start_step that already passed; start_step 0 (the template's) always has."""

TORCH_NPU_SAYS: dict[str, str] = {
    "start_step": "'Start step is not valid, will be reset to 0.' (and start_step 0 is never effective)",
    "active": "'Invalid parameter active, reset it to 1.'",
    "warmup": "'Invalid parameter warmup, reset it to 0.'",
    "is_rank": "'Set is_rank failed, is_rank must be bool!' (then every rank captures)",
    "rank_list": "'Set rank_list failed, rank_list must be list!' for a non-list (no rank captures); it drops "
                 "ids that are not ints >= 0 without a word",
    "activities": "'Set activity failed, activity must be CPU OR NPU!' (a non-string entry makes every dp.step() "
                  "fail: 'Call step failed')",
    "analyse": "a non-bool analyse is read as false (no online parse)",
    "async_mode": "a non-bool async_mode is read as false (a blocking parse)",
    "record_shapes": "'Parameter record_shapes is of boolean type, reset it to False.'",
    "profile_memory": "'Parameter profile_memory is of boolean type, reset it to False.'",
    "with_stack": "'Parameter with_stack is of boolean type, reset it to False.'",
    "with_flops": "'Parameter with_flops is of boolean type, reset it to False.'",
    "with_modules": "'Parameter with_modules is of boolean type, reset it to False.'",
    "prof_dir": "'Invalid parameter dir_name, reset it to default.' (rank dirs land in the rank's working dir)",
    "metadata": "'Invalid input key or value. Skip this metadata.' (a non-object metadata is ignored)",
    "profiler_level": "'Invalid parameter profiler_level, reset it to ProfilerLevel.Level0.'",
    "aic_metrics": "'Invalid parameter aic_metrics, reset it to default.'",
    "l2_cache": "'Invalid parameter l2_cache, which must be of bool type, reset it to False.'",
    "op_attr": "'Invalid parameter op_attr, which must be of bool type, reset it to False.'",
    "msprof_tx": "'Invalid parameter msprof_tx, which must be of bool type, reset it to False.'",
    "mstx": "'Invalid parameter mstx, which must be of bool type, reset it to False.'",
    "record_op_args": "'Invalid parameter record_op_args, which must be of bool type, reset it to False.'",
    "sys_io": "'Invalid parameter sys_io, which must be of bool type, reset it to False.'",
    "sys_interconnection": "'Invalid parameter sys_interconnection, which must be of bool type, reset it to False.'",
    "data_simplification": "'Invalid parameter data_simplification, which must be of bool type, reset it to "
                           "default.'",
    "export_type": "'Invalid parameter export_type, reset it to text.'",
    "gc_detect_threshold": "'Parameter gc_detect_threshold can not be negative, reset it to default.' / "
                           "'Parameter gc_detect_threshold is not int or float type, reset it to default.'",
    "host_sys": "'Invalid parameter host_sys, reset it to empty.'",
    "mstx_domain_include": "'Invalid parameter mstx_domain_include, which contents must be of str type, reset it "
                           "to default.'",
    "mstx_domain_exclude": "'Invalid parameter _mstx_domain_exclude, which contents must be of str type, reset it "
                           "to default.'",
}
"""For each key: what torch_npu does with a value this model refuses, quoting its own log line (verbatim)."""

AIC_NEEDS_LEVEL = "Please use level1 or level2 if you want to collect aic metrics, reset aic metrics to None!"
LEVEL_NONE_NEEDS_MSTX = "Parameter mstx or msprof_tx must be True if profiler_level is set to Level_none."
DOMAINS_NEED_MSTX = "mstx_domain_include and mstx_domain_exclude are valid when msprof_tx or mstx is True."
DOMAINS_BOTH = ("Parameter mstx_domain_include and mstx_domain_exclude can not be both set, only "
                "mstx_domain_include will work.")
OP_ATTR_NEEDS_DB = "op_attr switch is invalid with export type set as text."
ANALYSE_CLOSED = "profiler data analyse will be closed !"
EXPERIMENTAL_NEEDS_NPU = "Experimental config will not be used while ProfilerActivity.NPU is not set."
GC_NEEDS_CPU = "GC detect will not take effect while ProfilerActivity.CPU is not set."
NOT_IN_RANK_LIST = "not in valid rank_list"
"""torch_npu's log lines for resets that involve two keys (verbatim, torch-npu 2.13.0)."""


def _text_export() -> list[ExportType]:
    return ["text"]


def _cpu_npu() -> list[Literal["CPU", "NPU"]]:
    return ["CPU", "NPU"]


class InvalidProfilerConfig(ValueError):
    """A profiler_config.json content torch_npu would ignore, reset or misread; the message says which key,
    why, and what torch_npu would log."""


def _fmt(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "config"
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        if e["type"] == "missing":
            parts.append(f"{loc}: required")
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown key (torch_npu ignores it: a typo would silently do nothing)"
        says = next((TORCH_NPU_SAYS[str(x)] for x in e["loc"] if str(x) in TORCH_NPU_SAYS), None)
        tail = f"; torch_npu: {says}" if says and says not in msg else ""
        parts.append(f"{loc}: {msg} (got {e.get('input')!r}){tail}")
    return "; ".join(parts)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, validate_default=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidProfilerConfig(f"{type(self).__name__}: {_fmt(exc)}") from None


class ExperimentalConfig(_Strict):
    """``experimental_config`` members and values; defaults = torch_npu's template.

    Refused besides wrong types and unknown names (torch_npu's reset in brackets): aic_metrics other than
    AiCoreNone at Level0/Level_none (:data:`AIC_NEEDS_LEVEL`), Level_none without mstx/msprof_tx
    (:data:`LEVEL_NONE_NEEDS_MSTX`), mstx domains without mstx (:data:`DOMAINS_NEED_MSTX`) or both lists set
    (:data:`DOMAINS_BOTH`), op_attr without db export (:data:`OP_ATTR_NEEDS_DB`; depends on the CANN version,
    refused to be safe), an empty export_type.
    """

    profiler_level: ProfilerLevel = "Level0"
    aic_metrics: AicMetrics = "AiCoreNone"
    l2_cache: StrictBool = False
    op_attr: StrictBool = False
    gc_detect_threshold: float | None = None
    data_simplification: StrictBool = True
    record_op_args: StrictBool = False
    export_type: list[ExportType] = Field(default_factory=_text_export, min_length=1)
    msprof_tx: StrictBool = False
    mstx: StrictBool = False
    host_sys: list[HostSys] = Field(default_factory=list)
    mstx_domain_include: list[StrictStr] = Field(default_factory=list)
    mstx_domain_exclude: list[StrictStr] = Field(default_factory=list)
    sys_io: StrictBool = False
    sys_interconnection: StrictBool = False

    @field_validator("export_type", mode="before")
    @classmethod
    def _one_export(cls, v: Any) -> Any:
        """torch_npu accepts ``"text"``/``"db"`` or a list; normalise to a list."""
        return [v] if isinstance(v, str) else v

    @field_validator("gc_detect_threshold", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("must be a number >= 0 (ms) or null")  # noqa: TRY004 - a typed ValueError by contract
        if v < 0:
            raise ValueError("must be >= 0 (ms) or null")
        return float(v)

    @model_validator(mode="after")
    def _combinations(self) -> ExperimentalConfig:
        tx = self.mstx or self.msprof_tx
        if self.profiler_level in ("Level0", "Level_none") and self.aic_metrics != "AiCoreNone":
            raise ValueError(f"aic_metrics {self.aic_metrics} needs Level1 or Level2; torch_npu: '{AIC_NEEDS_LEVEL}'")
        if self.profiler_level == "Level_none" and not tx:
            raise ValueError(f"profiler_level Level_none needs mstx true; torch_npu: '{LEVEL_NONE_NEEDS_MSTX}'")
        if (self.mstx_domain_include or self.mstx_domain_exclude) and not tx:
            raise ValueError(f"mstx domains need mstx true; torch_npu: '{DOMAINS_NEED_MSTX}'")
        if self.mstx_domain_include and self.mstx_domain_exclude:
            raise ValueError(f"give mstx_domain_include or mstx_domain_exclude, not both; torch_npu: '{DOMAINS_BOTH}'")
        if self.op_attr and "db" not in self.export_type:
            raise ValueError(f"op_attr needs export_type db; torch_npu: '{OP_ATTR_NEEDS_DB}'")
        return self


class ProfilerConfig(_Strict):
    """torch_npu's ``profiler_config.json``. Field defaults are the template's.

    Refused (raises :class:`InvalidProfilerConfig`, quoting torch_npu's reaction): start_step 0 (the
    template default: never effective) or < -1 or non-int, active <= 0, warmup < 0, non-bool flags, unknown
    activities / levels / aic_metrics / export types / host_sys entries, non-int or negative rank ids, is_rank
    with an empty rank_list (no rank would capture), is_rank with analyse but without async_mode (torch_npu
    closes the online parse on the listed ranks: :data:`ANALYSE_CLOSED`), non-default ``experimental_config``
    without the NPU activity (:data:`EXPERIMENTAL_NEEDS_NPU`), ``gc_detect_threshold`` without the CPU activity
    (:data:`GC_NEEDS_CPU`), an empty prof_dir, unknown keys
    (including ``is_valid`` and ``NPU_MONITOR_START``), metadata over the ``add_metadata_json`` limits, a
    rendering over 1 MiB, and the ``experimental_config`` combinations of :class:`ExperimentalConfig`. A
    default-built ``ProfilerConfig()`` therefore raises: pass a start_step.
    """

    activities: list[Literal["CPU", "NPU"]] = Field(default_factory=_cpu_npu, min_length=1)
    prof_dir: StrictStr = Field(default="./", min_length=1)
    analyse: StrictBool = False
    async_mode: StrictBool = False
    record_shapes: StrictBool = False
    profile_memory: StrictBool = False
    with_stack: StrictBool = False
    with_flops: StrictBool = False
    with_modules: StrictBool = False
    active: StrictInt = Field(default=1, gt=0)
    warmup: StrictInt = Field(default=0, ge=0)
    start_step: StrictInt = 0
    is_rank: StrictBool = False
    rank_list: list[StrictInt] = Field(default_factory=list)
    metadata: dict[StrictStr, Any] = Field(default_factory=dict)
    experimental_config: ExperimentalConfig = Field(default_factory=ExperimentalConfig)

    @model_validator(mode="before")
    @classmethod
    def _refuse_internal_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "NPU_MONITOR_START" in data:
                raise ValueError("NPU_MONITOR_START turns the config into a dyno-monitor command; never write it")
            if "is_valid" in data:
                raise ValueError("is_valid is torch_npu-internal (its monitor sets it); never write it")
        return data

    @field_validator("activities", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        """Activity names are case-insensitive in torch_npu; normalise to upper case."""
        return [a.upper() if isinstance(a, str) else a for a in v] if isinstance(v, list) else v

    @field_validator("start_step")
    @classmethod
    def _start_step(cls, v: int) -> int:
        if v == 0:
            raise ValueError(f"start_step 0 never fires (torch_npu: '{NOT_EFFECTIVE}. The start_step=0, ...'); "
                             "use -1 or an absolute step >= 1")
        if v < -1:
            raise ValueError("start_step must be -1 (next step) or >= 1")
        return v

    @field_validator("rank_list")
    @classmethod
    def _ranks(cls, v: list[int]) -> list[int]:
        bad = [r for r in v if r < 0]
        if bad:
            raise ValueError(f"rank ids must be >= 0 (torch_npu drops {bad})")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        total = 0
        for k, val in v.items():
            try:
                n = len(json.dumps(val, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"metadata[{k!r}] is not JSON: {exc}") from None
            if n > MAX_METADATA_VALUE_CHARS or len(k) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"metadata[{k[:40]!r}] key or JSON value over {MAX_METADATA_VALUE_CHARS} chars")
            total += n + len(k)
        if total >= MAX_METADATA_TOTAL_CHARS:
            raise ValueError(f"metadata is {total} chars, over ~{MAX_METADATA_TOTAL_CHARS}")
        return v

    @model_validator(mode="after")
    def _rank_filter(self) -> ProfilerConfig:
        if self.is_rank and not self.rank_list:
            raise ValueError(f"is_rank with an empty rank_list captures no rank (torch_npu: 'Rank r {NOT_IN_RANK_LIST} "
                             "set()!' on every rank)")
        if "NPU" not in self.activities and self.experimental_config != ExperimentalConfig():
            raise ValueError(f"experimental_config settings need the NPU activity; torch_npu: '{EXPERIMENTAL_NEEDS_NPU}'")
        if "CPU" not in self.activities and self.experimental_config.gc_detect_threshold is not None:
            raise ValueError(f"gc_detect_threshold needs the CPU activity; torch_npu: '{GC_NEEDS_CPU}'")
        if self.is_rank and self.analyse and not self.async_mode:
            raise ValueError("is_rank with analyse needs async_mode true: torch_npu turns the online parse off on the "
                             f"listed ranks ('Rank r is in rank_list ... and async_mode is false, {ANALYSE_CLOSED}')")
        return self

    @classmethod
    def parse(cls, data: Any) -> ProfilerConfig:
        """Validate a parsed JSON object (e.g. a hand-edited file). Raises :class:`InvalidProfilerConfig`."""
        if not isinstance(data, dict):
            raise InvalidProfilerConfig(f"profiler_config.json must be a JSON object, got {type(data).__name__} "
                                        "(torch_npu's monitor: 'load json failed')")
        return cls(**data)

    def render(self) -> dict[str, Any]:
        """Return the JSON-ready dict of known keys only (what the config writer puts in the file).

        Raises :class:`InvalidProfilerConfig` if the JSON would exceed 1 MiB.
        """
        out = self.model_dump(mode="json")
        if len(json.dumps(out, indent=4)) > MAX_CONFIG_BYTES:
            raise InvalidProfilerConfig(f"rendered config over {MAX_CONFIG_BYTES} bytes")
        return out


IDLE_METADATA_KEY = "profwatch_idle"
"""``metadata`` key of the idle config: why it was written (e.g. "capture c-... cancelled")."""


def idle_config(note: str) -> dict[str, Any]:
    """The idle ``profiler_config.json``: every key at the template's value (``start_step`` 0) and
    ``metadata = {"profwatch_idle": note}`` (``note`` cut to 200 characters).

    Written over a cancelled arm whose window may not have started yet. torch_npu's dynamic_profile keeps one
    pending config per rank and a newer one replaces it; a start_step of 0 is then dropped at the next step as
    "not effective" (torch-npu 2.13.0 ``dynamic_profile.step``; 2.6.0 keeps it pending forever, which never fires
    either). So the cancelled arm never starts. A window already running is not stopped: a config seen during a
    capture is looked at after it ends (``docs/torch_npu-dynamic-profile.md``, start_step and config polling;
    checked against the real monitor in ``tests/conformance/test_monitor_protocol.py``).
    """
    out = ProfilerConfig(start_step=1, metadata={IDLE_METADATA_KEY: str(note)[:200]}).render()
    out["start_step"] = 0
    return out


def check_idle_config(content: Any) -> None:
    """Raise :class:`InvalidProfilerConfig` unless ``content`` is an idle config: a JSON object with
    ``start_step`` 0 (not a bool), for every rank (``is_rank`` false, no ``rank_list``: one for some ranks would
    leave the others' arm in place), otherwise a valid :class:`ProfilerConfig`."""
    if not isinstance(content, dict):
        raise InvalidProfilerConfig(f"an idle config must be a JSON object, got {type(content).__name__}")
    s = content.get("start_step")
    if type(s) is not int or s != 0:
        raise InvalidProfilerConfig(f"an idle config has start_step 0, got {s!r}")
    if content.get("is_rank", False) is not False or content.get("rank_list", []) != []:
        raise InvalidProfilerConfig("an idle config is for every rank: is_rank false and no rank_list, got "
                                    f"is_rank {content.get('is_rank')!r}, rank_list {content.get('rank_list')!r}")
    ProfilerConfig.parse({**content, "start_step": 1})
