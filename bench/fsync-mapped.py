#!/usr/bin/env python3
"""How long an fdatasync takes after a small write, by how the write was made.

Usage: bench/fsync-mapped.py [DIR] [N]   (DIR defaults to the current directory)

Each way writes N records of 120 bytes one after another into a 16 MiB file in DIR and
times the fdatasync after each:
- zero-write:  file written full of zeros first (as the log's journal), then write(2);
- zero-mapped: the same file, written through a shared mapping;
- alloc-write: file allocated with posix_fallocate (as a task's log), then write(2);
- alloc-mapped: the same, through a shared mapping (as a task's log writes).
It prints the median and p90 in microseconds. `storage/src/mapped.rs` cites it: the
journal keeps write(2) because zero-mapped is the slow one here.
"""
import mmap
import os
import sys
import time

SIZE = 16 << 20


def run(way, directory, n):
    path = os.path.join(directory, f"fsync-mapped-{way}.tmp")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        if way.startswith("alloc"):
            os.posix_fallocate(fd, 0, SIZE)
        else:
            os.write(fd, b"\0" * SIZE)
        os.fsync(fd)
        mapped = None
        if way.endswith("mapped"):
            mapped = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        record, at, took = b"x" * 120, 0, []
        for _ in range(n):
            if mapped is not None:
                mapped[at:at + len(record)] = record
            else:
                os.pwrite(fd, record, at)
            at += len(record)
            started = time.perf_counter()
            os.fdatasync(fd)
            took.append(time.perf_counter() - started)
        if mapped is not None:
            mapped.close()
        took.sort()
        print(f"{way:13} median {took[n // 2] * 1e6:7.0f} µs   p90 {took[n * 9 // 10] * 1e6:7.0f} µs")
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    for way in ["zero-write", "zero-mapped", "alloc-write", "alloc-mapped"]:
        run(way, directory, n)


if __name__ == "__main__":
    main()
