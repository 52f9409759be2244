#!/bin/bash
# Thirty-first session, call 3: placement's CPU margin on the H200 again (the open item of
# PERFORMANCE.md "Not measured yet"): call 2's DeepSeek-V2-Lite 4 x 128K row had static at
# 0.84x writescope's speed, static's C share (0.576 of the spill) at the balance of its two
# sides and writescope's (0.514, margin 1.4) PCIe-bound. margin_ab: writescope at the default
# 1.4, static, writescope at 1.2 and 1.0, two rounds of alternating order, one process.
source bench/results/run-helper.sh
call_begin 390
P=bench/profiles/h200.json
margin_ab margin-ab 360
call_end
