#!/usr/bin/env bash
# Final verification: every GPU check through the three gpu-dist scripts.
cd gpu-dist
bash run-engine.sh > $OUT/engine.txt 2>&1; echo "engine rc=$?" >> $OUT/progress.txt
bash run-pipeline.sh > $OUT/pipeline.txt 2>&1; echo "pipeline rc=$?" >> $OUT/progress.txt
CHECKS=1 GPUS=2 STEP_TIMEOUT=120 bash run.sh > $OUT/checks.txt 2>&1; echo "checks rc=$?" >> $OUT/progress.txt
cp gpu-out/summary.txt $OUT/checks-summary.txt 2>/dev/null
