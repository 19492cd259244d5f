"""Instance ``argv[1]`` raises after ``import popdist`` (so it writes its error record);
every other instance sleeps until the job is ended."""

import sys
import time

import popdist

if popdist.getInstanceIndex() == int(sys.argv[1]):
    print("about to fail", file=sys.stderr)
    raise ValueError(f"bad shard on instance {sys.argv[1]}")
time.sleep(60)
