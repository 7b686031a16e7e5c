"""The hosts of a job, read the way the launchers read them.

* ``-hosts a,b`` (hydra): one rank slot per name; ranks go round-robin (0 a, 1 b, 2 a, ...).
  ``a:2,b:2`` gives slots per host.
* hydra hostfile (``-f FILE``): ``host`` or ``host:N`` per line, ``#`` comments; ranks fill a host's
  N slots before moving on (blocks).
* Open MPI hostfile (``--hostfile FILE``): ``host slots=N`` per line, ``#`` comments.

Only the names and slot counts matter here (for ``mpi-sgd doctor``); launcher-specific keys such
as Open MPI's ``max_slots=`` are accepted and ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


_HYDRA = re.compile(r"(?P<name>[^\s:#]+)(?::(?P<slots>\d+))?")
_OPENMPI_SLOTS = re.compile(r"slots=(\d+)")


def _host(name: str, slots: str | None, where: str) -> Host:
    n = 1 if slots is None else int(slots)
    if n < 1:
        raise ValueError(f"{where}: {name} has {n} slots; a host needs at least 1")
    return Host(name, n)


def parse_hosts_option(text: str) -> list[Host]:
    """``a,b`` or ``a:2,b:2``, as given to ``mpiexec -hosts``."""
    hosts = []
    for part in (p.strip() for p in text.split(",")):
        m = _HYDRA.fullmatch(part)
        if not m:
            raise ValueError(f"-hosts: {part!r} is not a host name or host:N")
        hosts.append(_host(m["name"], m["slots"], "-hosts"))
    return hosts


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """Hosts from a hydra (``host:N``) or Open MPI (``host slots=N``) hostfile."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        first, *rest = line.split()
        if rest:  # Open MPI: "host slots=N [max_slots=M]"
            slots = next((m[1] for w in rest if (m := _OPENMPI_SLOTS.fullmatch(w))), None)
            hosts.append(_host(first, slots, where))
            continue
        m = _HYDRA.fullmatch(first)
        if not m:
            raise ValueError(f"{where}: {raw.strip()!r} is not 'host', 'host:N' or 'host slots=N'")
        hosts.append(_host(m["name"], m["slots"], where))
    if not hosts:
        raise ValueError(f"{source}: no hosts in it")
    return hosts


def read_hostfile(path: str | Path) -> list[Host]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read hostfile {str(path)!r}: {e.strerror}") from None
    return parse_hostfile(text, str(path))


def unique_names(hosts: list[Host]) -> list[str]:
    """Each host once, in the order given."""
    return list(dict.fromkeys(h.name for h in hosts))
