#!/bin/bash
cd /work/main
for i in 1 2 3; do
  /tmp/before-target/release/canal bench --quick --no-plots --out $OUT/before-$i > $OUT/before-$i.log 2>&1
  /work/main/target/release/canal bench --quick --no-plots --out $OUT/after-$i > $OUT/after-$i.log 2>&1
done
echo done > $OUT/DONE
