#!/usr/bin/env python3
"""libbraid.so exports its public API and nothing else (include/braid/export.h, libbraid.map).

  exports.py LIBBRAID.so INCLUDE_DIR

The public API is read from the installed headers: the C functions braid.h marks BRAID_EXPORT,
and the C++ classes and free functions the C++ headers mark so. Every C function must be exported;
every exported symbol must be one of those C functions or belong to one of those C++ names (its
members, its typeinfo and vtable); every marked C++ name must be exported. Prints each breach and
exits 1 if there is one, so that internal classes (the communicator, channels, transports) or the
standard library's template code never leak to programs and shims linking libbraid.
"""
import pathlib
import re
import subprocess
import sys

lib, incdir = sys.argv[1], pathlib.Path(sys.argv[2])
headers = {p.name: p.read_text() for p in sorted(incdir.glob("*.h*"))}
c_api = set(re.findall(r"^BRAID_EXPORT\s[^;(]*?\b(braid[A-Z]\w*)\s*\(", headers["braid.h"], re.M))
cxx_api = set()
for name, text in headers.items():
    if name.endswith(".hpp"):
        cxx_api |= set(re.findall(r"\b(?:class|struct)\s+(?:\[\[\w+\]\]\s+)?BRAID_EXPORT\s+(\w+)", text))
        cxx_api |= set(re.findall(r"^BRAID_EXPORT\s[^;(]*?\b(\w+)\s*\(", text, re.M))
if len(c_api) < 20 or len(cxx_api) < 5:
    sys.exit(f"exports: found only {len(c_api)} C functions and {len(cxx_api)} C++ names marked BRAID_EXPORT "
             f"in {incdir}: is the header parsing out of date?")

nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
raw = [line.split()[-1] for line in nm.splitlines() if len(line.split()) >= 3]
plain = subprocess.run(["c++filt"], input="\n".join(raw), capture_output=True, text=True, check=True).stdout.split("\n")
member = re.compile(r"^(?:typeinfo for |typeinfo name for |vtable for )?braid::(?:ddp::)?(\w+)")
bad, seen = [], set()
for mangled, name in zip(raw, plain):
    if mangled in c_api:
        seen.add(mangled)
        continue
    m = member.match(name)
    if m and m.group(1) in cxx_api:
        seen.add(m.group(1))
        continue
    bad.append(f"exported but not public API: {name}")
bad += [f"public but not exported: {n} (declared BRAID_EXPORT in {incdir})" for n in sorted((c_api | cxx_api) - seen)]
for line in bad[:40]:
    print(line)
if len(bad) > 40:
    print(f"... and {len(bad) - 40} more")
print(f"exports: {len(raw)} symbols exported; public API: {len(c_api)} C functions, {len(cxx_api)} C++ names "
      f"({', '.join(sorted(cxx_api))}); {len(bad)} breach(es)")
sys.exit(1 if bad else 0)
