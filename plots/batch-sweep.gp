# DynaExq's batch figures (experiments/batch-sweep.ini): throughput and P99 TTFT / TPOT against
# batch size for DynaExq, a static int4 deployment and an offloading baseline on Qwen3-30B-A3B
# on an RTX A6000; a fourth panel draws what the paper prints for this setting, its Tables 1-2
# (experiments/paper/batch-sweep.csv: the share of a layer's experts a batch activates), since the
# paper's latencies and throughputs are in its figures' images only. Run by `moesim plot
# batch-sweep`, which sets `csv`, `paper`, the terminal and the output.
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
# the paper's Tables 1-2 for Qwen3-30B-A3B (the datablocks exist, empty, without the file)
has_paper = exists("paper") && strlen(paper) > 0
phases = "decode prefill"
do for [k=1:2] {
    eval table(sprintf('$act%d', k))
    if (has_paper) {
        plot paper using (column('batch')):(column('active_pct')) with table \
             if (strcol('model') eq 'qwen3-30b-a3b' && strcol('phase') eq word(phases, k))
    }
    unset table
}
set datafile separator whitespace
unset datafile columnheaders

set multiplot layout 2, 2 title "DynaExq setting, simulated: Qwen3-30B-A3B on an RTX A6000 (48 GB, PCIe 4.0), 64 requests, batch 1-32\n{/*0.8 dynaexq: hot experts bf16, cold int4, migrated in the background; static int4: every expert resident at int4; mixtral-offload: bf16 LRU cache + speculative loads}"
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
set title "the paper's Tables 1-2: share of a layer's experts a batch activates\n{/*0.8 Qwen3-30B-A3B as DynaExq measured it; not simulated (the trace is fitted to Table 1)}"
set ylabel 'activated experts per layer (%)'
set yrange [0:100]
plot for [k=1:2] sprintf('$act%d', k) using 1:2 with linespoints lw 2 pt (k == 1 ? 9 : 11) ps 1.5 \
     lc rgb 'black' dt k title sprintf('paper, %s (Table %d)', word(phases, k), k)
unset multiplot
