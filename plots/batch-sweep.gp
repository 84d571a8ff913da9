# DynaExq's batch figures (experiments/batch-sweep.ini): throughput and P99 TTFT / TPOT against
# batch size for DynaExq, a static int4 deployment and an offloading baseline on Qwen3-30B-A3B
# on an RTX A6000. Run by `moesim plot batch-sweep`, which sets `csv`, the terminal and the
# output.
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
label(i) = i == 1 ? 'dynaexq' : i == 2 ? 'static int4' : 'mixtral-offload'
ok(i) = strcol('status') eq 'ok' && strcol('system') eq label(i)
do for [i=1:3] {
    eval table(sprintf('$t%d', i))
    plot csv using (column('batch.size')):(column('tokens_per_s')) with table if (ok(i))
    eval table(sprintf('$f%d', i))
    plot csv using (column('batch.size')):(column('ttft_ms.p99') / 1000) with table if (ok(i))
    eval table(sprintf('$p%d', i))
    plot csv using (column('batch.size')):(column('tpot_ms.p99')) with table if (ok(i))
    unset table
}
set datafile separator whitespace
unset datafile columnheaders

set multiplot layout 1, 3 title "DynaExq setting, simulated: Qwen3-30B-A3B on an RTX A6000 (48 GB, PCIe 4.0), 64 requests, batch 1-32\n{/*0.8 dynaexq: hot experts bf16, cold int4, migrated in the background; static int4: every expert resident at int4; mixtral-offload: bf16 LRU cache + speculative loads}"
set grid
set logscale x 2
set xtics (1, 2, 4, 8, 16, 32)
set xrange [0.8:40]
set xlabel 'batch size (requests in flight)'
set key top left box opaque
set title 'throughput'
set ylabel 'tokens / s (all tokens / makespan)'
set yrange [0:*]
plot for [i=1:3] sprintf('$t%d', i) using 1:2 smooth unique with linespoints lw 2 pt 7 lc i title label(i)
set title 'P99 time to first token'
set ylabel 'TTFT P99 (s)'
plot for [i=1:3] sprintf('$f%d', i) using 1:2 smooth unique with linespoints lw 2 pt 7 lc i title label(i)
set title 'P99 time per output token'
set ylabel 'TPOT P99 (ms)'
plot for [i=1:3] sprintf('$p%d', i) using 1:2 smooth unique with linespoints lw 2 pt 7 lc i title label(i)
unset multiplot
