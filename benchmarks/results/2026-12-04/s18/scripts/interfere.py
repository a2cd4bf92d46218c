"""The seventeenth session's interference probe (../../s17/scripts/interfere.py, its docstring says
what it measures), with one change for working sets larger than 1024 objects: each timed chunk walks
a window of 1024 of them, moving through the whole set, instead of all of them (12 ms a chunk at
40,000 objects, so that a 40 ms on/off switch left one chunk to time). Same arguments:

    python interfere.py --tokenizer .ab/tok [--seconds 6] [--objects 128]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../s17/scripts"))
import interfere as base  # noqa: E402  (its load_loop and Obj; spawned loads import it by that name)

_whole_set_chunk = base.chunk
_offset = [0]


def windowed_chunk(objs, table, window=1024):
    if len(objs) <= window:
        return _whole_set_chunk(objs, table)
    start = _offset[0]
    _offset[0] = (start + window) % (len(objs) - window)
    return _whole_set_chunk(objs[start:start + window], table)


base.chunk = windowed_chunk  # measure() looks it up in its module at each call

if __name__ == "__main__":
    base.main()
