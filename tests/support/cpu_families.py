"""Named CPU families, to run the CPU-dependent decisions as each of them.

``transformerkit.precisions`` decides from the CPU's flags and vendor (``auto``'s precision,
int8's activation range, the float32 kernel by vendor); ``TRANSFORMERKIT_CPU_FLAGS`` and
``TRANSFORMERKIT_CPU_VENDOR`` replace what it reads (its docstring). A family is such a pair
of values, as a CPU of that kind shows them in ``/proc/cpuinfo``:

- the decision tests inject every family (:func:`inject`) and derive each expectation from
  the family's capabilities (:meth:`Family.has`), never from the host's;
- ``make test-kernels`` runs the CPU-dependent test files as each family the host can run
  (:func:`host_can_run`): the override changes decisions, not kernels, so a family the host
  cannot run would make it decide for units it lacks (int8's full range on a CPU without
  VNNI saturates).

What the host can run is a question about the real hardware: :func:`host_flags` reads
``/proc/cpuinfo`` itself, never through the override.

As a script (``make test-kernels``): ``--runnable`` prints the families the host can run,
one a line; ``--skipped`` the others with the capabilities the host lacks; ``--env FAMILY``
the two assignments, for ``env``, that make a process see ``FAMILY``.
"""

import argparse
import sys
from typing import NamedTuple

# a capability -> the flags of which any one provides it
CAPABILITIES = {
    "avx2": frozenset({"avx2"}),
    "avx512": frozenset({"avx512f"}),
    # bfloat16 dot products: AVX512-BF16, or AMX's tiles (oneDNN takes either)
    "bfloat16": frozenset({"avx512_bf16", "amx_bf16"}),
    # 8-bit dot products without 16-bit saturation
    "vnni": frozenset({"avx512_vnni", "avx_vnni", "amx_int8"}),
}
OVERRIDE_FLAGS = "TRANSFORMERKIT_CPU_FLAGS"
OVERRIDE_VENDOR = "TRANSFORMERKIT_CPU_VENDOR"


class Family(NamedTuple):
    """A CPU family: its ``/proc/cpuinfo`` vendor and the flags that matter here."""

    name: str
    vendor: str
    flags: frozenset

    def has(self, capability):
        """Whether the family has ``capability`` (a key of :data:`CAPABILITIES`)."""
        return has(self.flags, capability)

    def env(self):
        """The environment that makes a process see this family (no spaces in the values,
        so a shell may split ``--env``'s output into ``env`` arguments)."""
        return {OVERRIDE_FLAGS: ",".join(sorted(self.flags)), OVERRIDE_VENDOR: self.vendor}


def _family(name, vendor, flags):
    return Family(name, vendor, frozenset(flags.split()))


_AVX512 = "avx2 fma avx512f avx512bw avx512vl avx512_vnni"
FAMILIES = {f.name: f for f in (
    _family("xeon-amx", "GenuineIntel", f"{_AVX512} avx512_bf16 amx_bf16 amx_int8 amx_tile"),
    _family("epyc-avx512bf16", "AuthenticAMD", f"{_AVX512} avx512_bf16"),
    _family("xeon-avx512-vnni", "GenuineIntel", _AVX512),
    _family("avx2", "GenuineIntel", "avx2 fma"),
)}


def has(flags, capability):
    """Whether ``flags`` give ``capability`` (a key of :data:`CAPABILITIES`)."""
    if capability not in CAPABILITIES:
        raise ValueError(f"capability must be one of {', '.join(CAPABILITIES)}; "
                         f"got {capability!r}")
    return bool(CAPABILITIES[capability] & flags)


def family(name):
    """The :class:`Family` called ``name``, else a ``ValueError`` naming the families."""
    if name not in FAMILIES:
        raise ValueError(f"CPU family must be one of {', '.join(FAMILIES)}; got {name!r}")
    return FAMILIES[name]


def inject(monkeypatch, cpu):
    """Make this process (and the processes it starts) see the family ``cpu`` (a name or a
    :class:`Family`) until the test ends."""
    cpu = family(cpu) if isinstance(cpu, str) else cpu
    for name, value in cpu.env().items():
        monkeypatch.setenv(name, value)
    return cpu


def host_field(name, path="/proc/cpuinfo"):
    """The field ``name`` of the first CPU in ``path``, read from the file itself (the
    overrides are for decisions; this is the hardware); ``""`` where there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, colon, value = line.partition(":")
                if colon and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def host_flags():
    """The host CPU's own flags (:func:`host_field`; empty where there is no
    ``/proc/cpuinfo``)."""
    return frozenset(host_field("flags").split())


def host_vendor():
    """The host CPU's own ``vendor_id`` (:func:`host_field`)."""
    return host_field("vendor_id")


def host_has(capability):
    """Whether the host's own CPU (:func:`host_flags`) has ``capability``."""
    return has(host_flags(), capability)


def flags_seen(environ):
    """The flags a process started with ``environ`` decides from: the family injected there
    (``TRANSFORMERKIT_CPU_FLAGS``, spaces or commas; empty: none), else the host's."""
    injected = environ.get(OVERRIDE_FLAGS, "").replace(",", " ").split()
    return frozenset(injected) if injected else host_flags()


def missing(cpu, flags=None):
    """The capabilities of the family ``cpu`` that ``flags`` (default: :func:`host_flags`)
    lack. Capabilities, not flags: a family's AMX bfloat16 runs on AVX512-BF16 units, its
    VNNI on AVX-VNNI, and the vendor changes no kernel's result."""
    flags = host_flags() if flags is None else flags
    return [c for c in CAPABILITIES if cpu.has(c) and not has(flags, c)]


def host_can_run(cpu, flags=None):
    """Whether the host (or ``flags``) has every capability of the family ``cpu``."""
    return not missing(cpu, flags)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--runnable", action="store_true",
                        help="the families this host can run, one a line")
    choice.add_argument("--skipped", action="store_true",
                        help="the families this host cannot run, and what it lacks")
    choice.add_argument("--env", metavar="FAMILY", choices=list(FAMILIES),
                        help="the assignments that make a process see FAMILY")
    args = parser.parse_args(argv)
    if args.env:
        print(" ".join(f"{k}={v}" for k, v in family(args.env).env().items()))
    for cpu in FAMILIES.values():
        lacks = missing(cpu)
        if args.runnable and not lacks:
            print(cpu.name)
        elif args.skipped and lacks:
            print(f"{cpu.name}: this CPU has no {', '.join(lacks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
