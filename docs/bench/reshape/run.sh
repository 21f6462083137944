#!/bin/bash
cd /work/main
for i in 1 2 3; do
  /tmp/before-target/release/canal bench --quick --no-plots --out /tmp/bq/before-$i > /tmp/bq/before-$i.log 2>&1
  /work/main/target/release/canal bench --quick --no-plots --out /tmp/bq/after-$i > /tmp/bq/after-$i.log 2>&1
done
echo done > /tmp/bq/DONE
