# DyMoE Table 3 shape (experiments/dymoe-ablation.ini): TTFT and TPOT of the six incremental
# ablation rows on Mixtral-8x7B under the 16 GB and 24 GB budgets. Run by `moesim plot
# dymoe-ablation`, which sets `csv`, the terminal and the output. The row number is the first
# character of the `ablation` label (1..6).
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
row(s) = real(s[1:1])
ok(b) = strcol('status') eq 'ok' && column('memory.budget_gb') == b
do for [b in "16 24"] {
    eval table(sprintf('$ttft%s', b))
    plot csv using (row(strcol('ablation'))):(column('ttft_ms.mean') / 1000) with table if (ok(real(b)))
    eval table(sprintf('$tpot%s', b))
    plot csv using (row(strcol('ablation'))):(column('tpot_ms.mean') / 1000) with table if (ok(real(b)))
    unset table
}
# the paper's Table 3 (experiments/paper/dymoe-ablation.csv; `moesim plot` sets `paper`)
# (the datablocks exist, empty, without it)
has_paper = exists("paper") && strlen(paper) > 0
do for [b in "16 24"] {
    col_ttft = b eq "16" ? 3 : 5
    eval table(sprintf('$pttft%s', b))
    if (has_paper) { plot paper using 1:(column(col_ttft)) with table }
    eval table(sprintf('$ptpot%s', b))
    if (has_paper) { plot paper using 1:(column(col_ttft + 1)) with table }
    unset table
}
set datafile separator whitespace
unset datafile columnheaders

set multiplot layout 1, 2 title "DyMoE Table 3 ablation, simulated: Mixtral-8x7B on an RTX 3090 (PCIe Gen3 x16), batch 1, r = 0.75\n{/*0.8 rows add the expert cache, the look-ahead prefetcher and dynamic quantization (4/2: sub-critical experts at int2; 4/0: skipped)}"
set style fill solid 0.85 border -1
set boxwidth 0.36
set grid ytics
set xrange [0.4:6.6]
set yrange [0:*]
set xtics ("1 on\ndemand" 1, "2 cache" 2, "3 cache\n+prefetch" 3, "4 cache\n+dyquant 4/2" 4, \
           "5 cache+4/2\n+prefetch" 5, "6 cache+4/0\n+prefetch" 6) font ',10'
set key top right box opaque
set xlabel 'Table 3 configuration' offset 0, -1.2
set bmargin 6

set title 'time to first token (mean over requests)'
set ylabel 'TTFT (s)'
plot '$ttft16' using ($1 - 0.19):2 with boxes lc rgb '#4477aa' title '16 GB budget', \
     '$ttft24' using ($1 + 0.19):2 with boxes lc rgb '#ee6677' title '24 GB budget', \
     '$pttft16' using ($1 - 0.19):2 with points pt 9 ps 1.6 lc rgb 'black' \
         title 'paper (DyMoE Table 3)', \
     '$pttft24' using ($1 + 0.19):2 with points pt 9 ps 1.6 lc rgb 'black' \
         notitle

set title 'time per output token (mean over decode steps)'
set ylabel 'TPOT (s)'
plot '$tpot16' using ($1 - 0.19):2 with boxes lc rgb '#4477aa' title '16 GB budget', \
     '$tpot24' using ($1 + 0.19):2 with boxes lc rgb '#ee6677' title '24 GB budget', \
     '$ptpot16' using ($1 - 0.19):2 with points pt 9 ps 1.6 lc rgb 'black' \
         title 'paper (DyMoE Table 3)', \
     '$ptpot24' using ($1 + 0.19):2 with points pt 9 ps 1.6 lc rgb 'black' \
         notitle
unset multiplot
