# LRU and Belady-OPT hit rate of a per-layer expert cache against its capacity, per model
# (experiments/hit-rate-curves.ini: the curves of `moesim trace stats`). Run by `moesim plot
# hit-rate-curves`, which sets `csv`, the terminal and the output. Each series is first copied
# into a datablock (`with table if`: only its rows, only status ok), then drawn sorted by x.
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
models = "Mixtral-8x7B OLMoE-1B-7B Qwen1.5-MoE-A2.7B Qwen3-30B-A3B"
ok(i) = strcol('status') eq 'ok' && strcol('model_name') eq word(models, i)
do for [i=1:words(models)] {
    eval table(sprintf('$lru%d', i))
    plot csv using (100 * column('capacity_share')):(100 * column('lru_hit_rate')) with table if (ok(i))
    eval table(sprintf('$opt%d', i))
    plot csv using (100 * column('capacity_share')):(100 * column('opt_hit_rate')) with table if (ok(i))
    unset table
}
set datafile separator whitespace
unset datafile columnheaders

set title "Expert-cache hit rate vs capacity: LRU (solid) and the Belady OPT bound (dashed), per model\n{/*0.8 per-layer cache over synthesized traces (16 requests x 256 tokens); moe-lrc rule of thumb: a cache of 2 x top-k experts per layer}"
set xlabel "cache capacity (% of a layer's routed experts)"
set ylabel 'hit rate (% of (token, slot) expert accesses)'
set xrange [0:100]
set yrange [0:100]
set key bottom right box opaque
set grid
plot for [i=1:words(models)] sprintf('$lru%d', i) using 1:2 smooth unique with linespoints lw 2 \
         pt 7 ps 0.8 lc i dt 1 title word(models, i).' LRU', \
     for [i=1:words(models)] sprintf('$opt%d', i) using 1:2 smooth unique with linespoints lw 2 \
         pt 6 ps 0.8 lc i dt 2 title word(models, i).' OPT'
