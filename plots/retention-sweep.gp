# DyMoE's retention knob (experiments/retention-sweep.ini): decode time per token against the
# share of gate mass run at HI precision as r goes from 0.5 to 1.0, for the 4/2 and 4/0
# strategies under the 16 and 24 GB budgets; left panel against r itself. Run by `moesim plot
# retention-sweep`, which sets `csv`, the terminal and the output.
set datafile separator ','
set datafile columnheaders
# A series' datablock, created holding one comment line so that a series without rows (a policy
# not built in, every run failed) plots as empty instead of failing the figure.
table(name) = sprintf('set print %s; print "# %s"; unset print; set table %s append', name, name, name)
# one series per strategy, budget and Eq. 5 rounding (carry: solid; ceil, the literal: dashed)
strats = "4/2 4/0 4/2 4/0 4/2 4/0 4/2 4/0"
budgets = "16 16 24 24 16 16 24 24"
rounds = "carry carry carry carry ceil ceil ceil ceil"
strat(i) = word(strats, i)
budget(i) = real(word(budgets, i))
rnd(i) = word(rounds, i)
series = strats
ok(i) = strcol('status') eq 'ok' && strcol('strategy') eq strat(i) && column('memory.budget_gb') == budget(i) && strcol('dymoe.rounding') eq rnd(i)
do for [i=1:words(series)] {
    eval table(sprintf('$r%d', i))
    plot csv using (column('dymoe.retention')):(column('tpot_ms.mean')) with table if (ok(i))
    eval table(sprintf('$h%d', i))
    plot csv using (100 * column('precision_mix.hi')):(column('tpot_ms.mean')) with table if (ok(i))
    unset table
}
set datafile separator whitespace
unset datafile columnheaders

point(i) = budget(i) == 16 ? 7 : 5   # 16 GB filled circles, 24 GB squares
colour(i) = (i - 1) % 4 + 1          # strategy x budget
dash(i) = rnd(i) eq 'carry' ? 1 : 2
set multiplot layout 1, 2 title "DyMoE retention ratio r as a latency-quality knob (Fig. 11 setting), simulated: Mixtral-8x7B on an RTX 3090 (PCIe Gen3 x16), batch 1\n{/*0.8 4/2: sub-critical experts at int2; 4/0: skipped; critical experts at int4; r = 0.50 ... 1.00}"
set grid
set key top left box opaque
set ylabel 'TPOT (ms, mean over decode steps)'
set yrange [0:*]
set title 'decode time per token vs retention ratio r'
set xlabel 'retention ratio r (average share of experts kept critical, Eq. 4)'
plot for [i=1:words(series)] sprintf('$r%d', i) using 1:2 smooth unique with linespoints lw 2 \
     pt point(i) lc colour(i) dt dash(i) \
     title sprintf('%s, %g GB, %s', strat(i), budget(i), rnd(i))
set title 'decode time per token vs the quality it keeps'
set xlabel 'gate mass run at HI precision: int4, critical (%)'
plot for [i=1:words(series)] sprintf('$h%d', i) using 1:2 smooth unique with linespoints lw 2 \
     pt point(i) lc colour(i) dt dash(i) \
     title sprintf('%s, %g GB, %s', strat(i), budget(i), rnd(i))
unset multiplot
