"""The reference pipe reader for bench/reader.py: PaddleRec's pattern, one Python generator
per line through ``MultiSlotDataGenerator`` (what PaddleRec's rank readers do).

Input: one TSV line per row: label, dense values (comma-separated), then one column per
sparse slot (values comma-separated). Output: MultiSlot text in streamrec's slot order.
Run with PYTHONHASHSEED=0: it hashes with Python's built-in C ``hash``, the fastest
per-value hash a Python reader can use, which flatters the reference.
"""

import sys

from paddle.distributed.fleet import MultiSlotDataGenerator

SLOTS = sys.argv[1].split(",")


class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def rows():
            cols = line.rstrip("\n").split("\t")
            label, dense, sparse = cols[0], cols[1], cols[2:]
            sample = [
                (slot, [hash(slot + "\x1f" + v) & 0xFFFFFFFFFFFFFFFF for v in values.split(",")])
                for slot, values in zip(SLOTS, sparse, strict=True)
            ]
            sample.append(("dense", [float(x) for x in dense.split(",")]))
            sample.append(("label", [int(label)]))
            yield sample

        return rows


Reader().run_from_stdin()
