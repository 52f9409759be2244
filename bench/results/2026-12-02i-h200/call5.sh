#!/bin/bash
# Twenty-fourth session, call 5: issue 9's spilled table (both shapes, shares 0.5-0.65, medians of
# seven steps) twice on the session's last tree.
source bench/results/run-helper.sh
call_begin 300
hybrid_table hyb-a 110
hybrid_table hyb-b 110
call_end
