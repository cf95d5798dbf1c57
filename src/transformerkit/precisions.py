"""The precisions a trained model decodes in, and the choice ``auto`` makes from the CPU.

``float32`` is the precision models train in. ``bfloat16`` and ``int8`` change only the
products of the ``Dense`` layers at inference (:mod:`transformerkit.kernels.lowprec`);
``auto`` picks one of them for this machine (:func:`choose`):

- **bfloat16** where the CPU has bfloat16 dot-product units (``avx512_bf16`` or
  ``amx_bf16`` in ``/proc/cpuinfo``) and oneDNN may use them (``ONEDNN_MAX_CPU_ISA``, if
  set, is ``AVX512_CORE_BF16`` or above): its products ran 1.3-2x as fast on an
  AVX512-BF16 CPU (AMX units are faster still), and its
  outputs stay within bfloat16 rounding of float32's (docs/benchmarks.md, "Decoding
  precision").
- **float32** elsewhere. Not int8: int8 rounds every product's input to 8 bits, which moves
  translations further from float32's than bfloat16 does; it is there to be asked for.

The CPU is read from the first processor of ``/proc/cpuinfo`` (:func:`cpu_flags`,
:func:`cpu_vendor`), here and nowhere else. Two environment variables replace what is read,
so that the test suite can run as another CPU family (``make test-kernels``):
``TRANSFORMERKIT_CPU_FLAGS`` (flags separated by spaces or commas) replaces the ``flags``
field and ``TRANSFORMERKIT_CPU_VENDOR`` the ``vendor_id``; unset or empty, the CPU's own are
read. They change the decisions made from the CPU (``auto``, int8's activation range, the
float32 kernel by vendor), not the kernels the host runs: PyTorch, oneDNN and FBGEMM still
dispatch on the real CPU. Declare only flags the host has (an ``int8`` range chosen for VNNI
saturates on a CPU without it); ``ONEDNN_MAX_CPU_ISA`` is the setting that changes kernels.

Plain Python (no Keras, no PyTorch): the runtime options (``decoding/options.py``) read
:data:`DECODE_PRECISIONS` from here.
"""

import functools
import os

DECODE_PRECISIONS = ("float32", "bfloat16", "int8", "auto")

# oneDNN's ONEDNN_MAX_CPU_ISA values, lowest first (its documentation, "CPU dispatcher
# control"); a cap at or above AVX512_CORE_BF16 leaves the bfloat16 instructions on
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16",
                "AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16",
                "AVX512_CORE_AMX_FP16")
_BFLOAT16_ISA = _ONEDNN_ISAS.index("AVX512_CORE_BF16")


def check(precision, what="precision"):
    """``precision`` if it is one of :data:`DECODE_PRECISIONS`, else a clear
    ``ValueError``."""
    if precision not in DECODE_PRECISIONS:
        raise ValueError(f"{what} must be one of {', '.join(DECODE_PRECISIONS)}; got "
                         f"{precision!r}")
    return precision


# the fields of /proc/cpuinfo that an environment variable may replace (module docstring)
# the kernel caps in the environment that a compiled package's code depends on: Inductor
# vectorizes its C++ for the ISA ATEN_CPU_CAPABILITY allows, and frozen weights are packed
# for oneDNN's (decoding/aot_step.py, aot_search.py)
KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")

CPU_OVERRIDES = {"flags": "TRANSFORMERKIT_CPU_FLAGS", "vendor_id": "TRANSFORMERKIT_CPU_VENDOR"}


def _first_cpu_field(name):
    """The value of the field ``name`` of the first CPU: its override in the environment
    (:data:`CPU_OVERRIDES`) where set and not empty, read at every call so that a test may
    set it; else ``/proc/cpuinfo``'s (read once), or ``""`` where there is no such field or
    file (not Linux)."""
    override = os.environ.get(CPU_OVERRIDES.get(name, ""), "").strip()
    if override:
        return override
    return _cpuinfo_fields().get(name, "")


@functools.cache
def _cpuinfo_fields():
    """The fields of the first CPU's block of ``/proc/cpuinfo`` (``{}`` where there is no such
    file); the first of a repeated name."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the end of the first CPU's block
                    continue
                key, colon, value = line.partition(":")
                if colon:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags():
    """The instruction-set flags of the first CPU in ``/proc/cpuinfo`` or of
    ``TRANSFORMERKIT_CPU_FLAGS`` (module docstring; an empty set where neither is there:
    not Linux)."""
    return frozenset(_first_cpu_field("flags").replace(",", " ").split())


def cpu_vendor():
    """The ``vendor_id`` of the first CPU in ``/proc/cpuinfo`` (``GenuineIntel``,
    ``AuthenticAMD``, ...) or ``TRANSFORMERKIT_CPU_VENDOR`` (module docstring), or ``""``
    where there is none."""
    return _first_cpu_field("vendor_id")


def onednn_cap():
    """``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``) upper-cased, or None
    when unset or ``ALL``/``DEFAULT`` (no cap)."""
    value = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    value = (value or "").strip().upper()
    return None if value in ("", "ALL", "DEFAULT") else value


def bfloat16_units(flags=None, cap=None):
    """``(usable, why)``: whether oneDNN can run bfloat16 products on this CPU's own units
    (``flags``: :func:`cpu_flags`; ``cap``: :func:`onednn_cap`), and a short reason."""
    flags = cpu_flags() if flags is None else flags
    cap = onednn_cap() if cap is None else cap
    units = sorted({"avx512_bf16", "amx_bf16"} & flags)
    if not units:
        return False, "the CPU has no bfloat16 units (no avx512_bf16 or amx_bf16 flag)"
    if cap is not None and cap in _ONEDNN_ISAS and _ONEDNN_ISAS.index(cap) < _BFLOAT16_ISA:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN below AVX512_CORE_BF16"
    return True, f"the CPU has {' and '.join(units)}"


def has_vnni(flags=None):
    """Whether the CPU has 8-bit dot-product instructions (VNNI), which sum ``uint8 *
    int8`` pairs without the 16-bit saturation of older x86 (int8 then uses all 8 bits of
    the activations; see ``kernels/lowprec.py``)."""
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & flags)


def onednn_vnni(flags=None, cap=None):
    """Whether oneDNN may run VNNI's 8-bit dot products here: :func:`has_vnni`, within the
    kernel cap ``ONEDNN_MAX_CPU_ISA`` (``cap``: :func:`onednn_cap`; below ``AVX2_VNNI`` it
    keeps oneDNN on the saturating instructions whatever the CPU has)."""
    flags = cpu_flags() if flags is None else flags
    cap = onednn_cap() if cap is None else cap
    if cap is None or cap not in _ONEDNN_ISAS:
        return has_vnni(flags)
    level = _ONEDNN_ISAS.index(cap)
    return (level >= _ONEDNN_ISAS.index("AVX2_VNNI") and "avx_vnni" in flags) or \
        (level >= _ONEDNN_ISAS.index("AVX512_CORE_VNNI")
         and bool({"avx512_vnni", "amx_int8"} & flags))


def choose(precision, low_precision_possible=True):
    """``(precision, why)``: ``precision`` itself, or for ``auto`` the one this machine
    decodes in (module docstring); ``low_precision_possible``: False where only float32
    runs (another backend, the fast paths off), which ``auto`` then picks."""
    check(precision)
    if precision != "auto":
        return precision, "asked for"
    if not low_precision_possible:
        return "float32", "bfloat16 and int8 run on the PyTorch backend with its fast paths"
    usable, why = bfloat16_units()
    return ("bfloat16" if usable else "float32"), why
