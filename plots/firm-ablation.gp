# FIRM-MoE Table 1 shape (experiments/firm-ablation.ini): decode latency of the five design
# rows (Baseline, +FG, +MoL, +FG+MoL, All) at expert caches of 128, 256, 512 and 768 experts on
# Qwen1.5-MoE-A2.7B as grouped bars, and each row's speedup over Baseline, with Table 1's
# published figures (experiments/paper/firm-ablation.csv) as triangles on the bars. Run by
# `moesim plot firm-ablation`, which sets `csv`, `paper`, the terminal and the output. The
# experiment's other rows (the fixed (K, P) grid of experiments/firm-table1.sh) are not drawn.
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
rows = "Baseline +FG +MoL +FG+MoL All"
group(c) = c == 128 ? 1 : c == 256 ? 2 : c == 512 ? 3 : 4
ok(r) = strcol('status') eq 'ok' && strcol('row') eq word(rows, r)
do for [r=1:words(rows)] {
    eval table(sprintf('$r%d', r))
    plot csv using (group(column('label.cache_experts'))):(column('tpot_ms.mean')) with table if (ok(r))
    unset table
}
# the paper's Table 1 (the datablocks exist, empty, without it)
has_paper = exists("paper") && strlen(paper) > 0
do for [r=1:words(rows)] {
    eval table(sprintf('$p%d', r))
    if (has_paper) {
        plot paper using (group(column('cache_experts'))):(1000 * column('latency_s')):(column('speedup')) \
             with table if (strcol('row') eq word(rows, r))
    }
    unset table
}
set datafile separator whitespace
unset datafile columnheaders
# Baseline's simulated TPOT per cache group, the denominator of the simulated speedups
array base[4] = [NaN, NaN, NaN, NaN]
set table $unused
plot '$r1' using (base[int($1)] = $2, $1):2 with table
unset table

set multiplot layout 1, 2 title "FIRM-MoE Table 1 ablation, simulated beside the paper: Qwen1.5-MoE-A2.7B on an RTX 3090 (PCIe 4.0), batch 1, about 2,000 tokens\n{/*0.8 Baseline: equal-ratio coarse prefetch (top-k of the previous layer, whole experts); FG: prefetch the first linear layer only (n = 1); MoL: Meeting-of-Layers K = 3, P = 3; All: + HEOP}\n{/*0.8 bars: simulated; triangles: the paper's Table 1}"
set style fill solid 0.85 border -1
set boxwidth 0.15
set grid ytics
set xrange [0.4:4.6]
set xtics ("128" 1, "256" 2, "512" 3, "768" 4)
set xlabel 'GPU expert cache (experts, all layers)'
set key top right box opaque width 2 font ',10'
offset(r) = (r - 3) * 0.16

set title "decode latency (log scale)\n{/*0.8 the paper's latencies are an order of magnitude above the simulated ones}"
set ylabel 'ms per output token (mean TPOT)'
set logscale y
set yrange [5:1000]
plot for [r=1:words(rows)] sprintf('$r%d', r) using ($1 + offset(r)):2 with boxes lc r \
         title word(rows, r), \
     for [r=1:words(rows)] sprintf('$p%d', r) using ($1 + offset(r)):2 with points pt 9 ps 1.4 \
         lc rgb 'black' title (r == 1 ? 'paper (Table 1)' : '')

set title 'speedup over Baseline at the same cache'
set ylabel "Baseline's latency / the row's"
unset logscale y
set yrange [0:1.9]
set key top left
plot for [r=1:words(rows)] sprintf('$r%d', r) using ($1 + offset(r)):(base[int($1)] / $2) \
         with boxes lc r title word(rows, r), \
     for [r=1:words(rows)] sprintf('$p%d', r) using ($1 + offset(r)):3 with points pt 9 ps 1.4 \
         lc rgb 'black' title (r == 1 ? 'paper (Table 1)' : ''), \
     1 with lines dt 2 lc rgb 'gray40' notitle
unset multiplot
