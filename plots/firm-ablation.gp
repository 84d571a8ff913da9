# FIRM-MoE Table 1 shape (experiments/firm-ablation.ini): decode latency of the five design
# rows (Baseline, +FG, +MoL, +FG+MoL, All) at expert caches of 128, 256, 512 and 768 experts on
# Qwen1.5-MoE-A2.7B, as grouped bars. Run by `moesim plot firm-ablation`, which sets `csv`, the
# terminal and the output.
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
set datafile separator whitespace
unset datafile columnheaders

set title "FIRM-MoE Table 1 ablation, simulated: Qwen1.5-MoE-A2.7B on an RTX 3090 (PCIe 4.0), batch 1, about 2,000 tokens\n{/*0.8 Baseline: equal-ratio coarse prefetch (top-k of the previous layer, whole experts); FG: prefetch the first linear layer only (n = 1); MoL: Meeting-of-Layers K = 3, P = 3; All: + HEOP}"
set style fill solid 0.85 border -1
set boxwidth 0.15
set grid ytics
set xrange [0.4:4.6]
set yrange [0:*]
set xtics ("128" 1, "256" 2, "512" 3, "768" 4)
set xlabel 'GPU expert cache (experts, all layers)'
set ylabel 'decode latency (ms per output token, mean TPOT)'
set key top right box opaque width 2
plot for [r=1:words(rows)] sprintf('$r%d', r) using ($1 + (r - 3) * 0.16):2 with boxes lc r \
     title word(rows, r)
