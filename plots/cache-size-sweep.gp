# FIRM-MoE Figure 4 shape (experiments/cache-size-sweep.ini): decode latency (TPOT) against the
# GPU expert cache size for every policy, with the oracle as the bound, on Qwen1.5-MoE-A2.7B and
# OLMoE-1B-7B. Run by `moesim plot cache-size-sweep`, which sets `csv`, the terminal and the
# output.
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
policies = "ondemand lru lfu mixtral-offload dymoe dynaexq firm-moe oracle"
models = "qwen1.5-moe-a2.7b olmoe-1b-7b"
ok(m, p) = strcol('status') eq 'ok' && strcol('model') eq word(models, m) && strcol('policy') eq word(policies, p)
do for [m=1:2] {
    do for [p=1:words(policies)] {
        eval table(sprintf('$d%d_%d', m, p))
        plot csv using (column('label.cache_experts')):(column('tpot_ms.mean')) with table if (ok(m, p))
        unset table
    }
}
set datafile separator whitespace
unset datafile columnheaders

set multiplot layout 1, 2 title "Decode latency vs GPU expert cache size, every policy (FIRM-MoE Fig. 4 setting), simulated: RTX 3090 over PCIe 4.0, batch 1\n{/*0.8 cache = one HBM pool of N bf16 experts (over all layers); oracle = Belady eviction + perfect next-layer prefetch: the bound of the bf16 policies. dymoe (int4/int2) and dynaexq (bf16/int4)}\n{/*0.8 store quantized experts, so more fit in the same bytes and they can go below it; a missing point: the policy refuses that cache (too small for its working set)}"
set grid
set logscale y
set xlabel 'GPU expert cache (experts, all layers)'
set ylabel 'TPOT (ms per output token, log scale)'
set xtics (128, 256, 512, 768, 896)
set xrange [64:960]
set key bottom left box opaque font ",10"
titles = "Qwen1.5-MoE-A2.7B OLMoE-1B-7B"
last(p) = p == words(policies)   # the oracle: the bound, drawn dashed and thicker
width(p) = last(p) ? 3 : 2
dash(p) = last(p) ? 2 : 1
do for [m=1:2] {
    set title word(titles, m)
    plot for [p=1:words(policies)] sprintf('$d%d_%d', m, p) using 1:2 smooth unique \
         with linespoints lw width(p) pt p ps 1.2 lc p dt dash(p) \
         title word(policies, p)
}
unset multiplot
