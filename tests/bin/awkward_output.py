"""Write output the hard way: partial lines, \r progress, split UTF-8, no final newline."""

import os
import time

index = os.environ["POPDIST_INSTANCE_INDEX"]
os.write(1, f"start {index} ".encode())
time.sleep(0.05)
os.write(1, b"continued\n")
for pct in (10, 50, 100):
    os.write(1, f"progress {pct}%\r".encode())
    time.sleep(0.02)
os.write(1, b"\n")
snow = "❄".encode()
os.write(1, snow[:1])
time.sleep(0.05)
os.write(1, snow[1:] + f" from {index}\n".encode())
os.write(2, f"to stderr {index}\n".encode())
os.write(1, f"last {index}".encode())
