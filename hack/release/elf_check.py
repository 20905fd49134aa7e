"""Checks release binaries: ELF of the expected machine, statically linked (no PT_INTERP, no
DT_NEEDED), so they run in any image and on any distribution of that architecture.

    python3 hack/release/elf_check.py amd64|arm64 BINARY...
"""

import struct
import sys

MACHINES = {"amd64": 62, "arm64": 183}  # EM_X86_64, EM_AARCH64
PT_INTERP, PT_DYNAMIC, DT_NEEDED = 3, 2, 1


def check(path, machine):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return "not a 64-bit little-endian ELF file"
    (e_machine,) = struct.unpack_from("<H", data, 18)
    if e_machine != machine:
        return f"ELF machine {e_machine}, expected {machine}"
    e_phoff, = struct.unpack_from("<Q", data, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    for i in range(e_phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == PT_INTERP:
            return "has a program interpreter (dynamically linked)"
        if p_type == PT_DYNAMIC:
            for j in range(0, p_filesz, 16):
                tag, _ = struct.unpack_from("<qQ", data, p_offset + j)
                if tag == DT_NEEDED:
                    return "needs a shared library (DT_NEEDED)"
                if tag == 0:
                    break
    return None


def main():
    arch, paths = sys.argv[1], sys.argv[2:]
    failed = False
    for path in paths:
        problem = check(path, MACHINES[arch])
        print(f"elf_check: {path}: {problem or f'static linux/{arch}'}")
        failed |= problem is not None
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
