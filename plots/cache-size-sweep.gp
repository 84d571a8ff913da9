# FIRM-MoE Figure 4 shape (experiments/cache-size-sweep.ini): decode latency (TPOT) against the
# GPU expert cache size for every policy and the paper's baseline BB, with the oracle as the
# bound, on Qwen1.5-MoE-A2.7B and OLMoE-1B-7B; a third panel sets the ratios the paper's text
# states for Fig. 4 (experiments/paper/cache-size-sweep.csv; its latencies are in the image only)
# beside the simulated ones. Run by `moesim plot cache-size-sweep`, which sets `csv`, `paper`, the
# terminal and the output.
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
policies = "ondemand lru lfu mixtral-offload dymoe dynaexq firm-moe oracle"
models = "qwen1.5-moe-a2.7b olmoe-1b-7b"
ok(m, p, v) = strcol('status') eq 'ok' && strcol('model') eq word(models, m) && strcol('policy') eq p && strcol('variant') eq v
do for [m=1:2] {
    do for [p=1:words(policies)] {
        eval table(sprintf('$d%d_%d', m, p))
        plot csv using (column('label.cache_experts')):(column('tpot_ms.mean')) with table if (ok(m, word(policies, p), 'default'))
        unset table
    }
    eval table(sprintf('$bb%d', m))
    plot csv using (column('label.cache_experts')):(column('tpot_ms.mean')) with table if (ok(m, 'firm-moe', 'BB'))
    unset table
}
# the ratios the paper states (the datablock exists, empty, without the file)
has_paper = exists("paper") && strlen(paper) > 0
eval table('$paper')
if (has_paper) { plot paper using 0:(column('value')):(strcol('bound') eq '<' ? 1 : 0) with table }
unset table
set datafile separator whitespace
unset datafile columnheaders

# the simulated counterparts on Qwen1.5 (policy firm-moe and BB at 128 and 768 experts)
array fm[2] = [NaN, NaN]
array bb[2] = [NaN, NaN]
slot(c) = c == 128 ? 1 : c == 768 ? 2 : 0
set table $unused
plot '$d1_7' using (slot($1) > 0 ? fm[slot($1)] = $2 : 0, $1):2 with table, \
     '$bb1' using (slot($1) > 0 ? bb[slot($1)] = $2 : 0, $1):2 with table
unset table
set print $simratio
print sprintf("0 %g", bb[1] / fm[1])
print sprintf("1 %g", bb[2] / fm[2])
print sprintf("2 %g", fm[1] / fm[2])
unset print

set multiplot layout 1, 3 title "Decode latency vs GPU expert cache size, every policy (FIRM-MoE Fig. 4 setting), simulated: RTX 3090 over PCIe 4.0, batch 1\n{/*0.8 cache = one HBM pool of N bf16 experts (over all layers); oracle = Belady eviction + perfect next-layer prefetch, a reference line (not a bound with prompt steps). dymoe (int4/int2) and dynaexq (bf16/int4)}\n{/*0.8 store quantized experts, so more fit in the same bytes and they can go below it; a missing point: the policy refuses that cache (too small for its working set)}"
set grid
set logscale y
set xlabel 'GPU expert cache (experts, all layers)'
set ylabel 'TPOT (ms per output token, log scale)'
set xtics (128, 256, 512, 768, 896)
set xrange [64:960]
set key bottom left box opaque font ",9"
titles = "Qwen1.5-MoE-A2.7B OLMoE-1B-7B"
last(p) = p == words(policies)   # the oracle: the reference, drawn dashed and thicker
width(p) = last(p) ? 3 : 2
dash(p) = last(p) ? 2 : 1
do for [m=1:2] {
    set title word(titles, m)
    plot for [p=1:words(policies)] sprintf('$d%d_%d', m, p) using 1:2 smooth unique \
         with linespoints lw width(p) pt p ps 1.2 lc p dt dash(p) \
         title word(policies, p), \
         sprintf('$bb%d', m) using 1:2 smooth unique with linespoints lw 2 pt 12 ps 1.2 \
         lc rgb 'black' dt 3 title 'firm-moe BB (Table 1 Baseline)'
}
set title "Qwen1.5: ratios the paper's text states\n{/*0.8 (Fig. 4's latencies are in its image only)}"
unset logscale y
set grid ytics
set xrange [-0.6:2.6]
set yrange [0:*]
set offsets 0, 0, graph 0.2, 0  # room above the highest bar or point for the key
set xtics ("BB/FIRM 128" 0, "BB/FIRM 768" 1, "FIRM 128/768" 2) font ",9"
set xlabel ''
set ylabel 'ratio of decode latencies (TPOT)'
set style fill solid 0.85 border -1
set boxwidth 0.5
set key top left box opaque font ",9" width 1
plot '$simratio' using 1:2 with boxes lc rgb '#4477aa' title 'simulated', \
     '$paper' using 1:($3 == 0 ? $2 : NaN) with points pt 9 ps 1.8 lc rgb 'black' \
         title 'paper', \
     '$paper' using 1:($3 == 1 ? $2 : NaN) with points pt 11 ps 1.8 lc rgb 'black' \
         title 'paper: at most', \
     1 with lines dt 2 lc rgb 'gray40' notitle
unset multiplot
