#!/bin/bash
# Twenty-sixth session, call 2: issue 9's spilled table, single form only (the split form read
# 0.93-1.00x the single one in call 1 and is no longer the bench's default), twice.
source bench/results/run-helper.sh
call_begin 330
hybrid_table hyb-c 130
hybrid_table hyb-d 130
call_end
