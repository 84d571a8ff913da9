# DyMoE's retention knob (experiments/retention-sweep.ini): decode time per token against the
# share of gate mass run at HI precision as r goes from 0.5 to 1.0, for the 4/2 and 4/0
# strategies under the 16 and 24 GB budgets; left panel against r itself, with the TPOT DyMoE's
# Table 3 prints at r = 0.75; right panel the paper's accuracy against r (Table 2, the points of
# Figure 11), which a trace cannot give (experiments/paper/retention-sweep.csv). Run by `moesim
# plot retention-sweep`, which sets `csv`, `paper`, the terminal and the output.
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
# the paper's figures (the datablocks exist, empty, without the file): Table 3's TPOT at r = 0.75
# per series i = 1..4 (strategy x budget), Table 2's accuracy per benchmark b and strategy s
has_paper = exists("paper") && strlen(paper) > 0
benches = "MMLU CMMLU GSM8K"
paper_strats = "4/2 4/0"
do for [i=1:4] {
    eval table(sprintf('$pt%d', i))
    if (has_paper) {
        plot paper using (column('r')):(1000 * column('value')) with table \
             if (strcol('metric') eq 'tpot_s' && strcol('strategy') eq strat(i) && column('budget_gb') == budget(i))
    }
    unset table
}
do for [b=1:3] {
    do for [k=1:2] {
        eval table(sprintf('$acc%d_%d', b, k))
        if (has_paper) {
            plot paper using (column('r')):(100 * column('value')) with table \
                 if (strcol('metric') eq word(benches, b) && strcol('strategy') eq word(paper_strats, k))
        }
        unset table
    }
}
set datafile separator whitespace
unset datafile columnheaders

point(i) = budget(i) == 16 ? 7 : 5   # 16 GB filled circles, 24 GB squares
colour(i) = (i - 1) % 4 + 1          # strategy x budget
dash(i) = rnd(i) eq 'carry' ? 1 : 2
set multiplot layout 1, 3 title "DyMoE retention ratio r as a latency-quality knob (Fig. 11 setting), simulated: Mixtral-8x7B on an RTX 3090 (PCIe Gen3 x16), batch 1\n{/*0.8 4/2: sub-critical experts at int2; 4/0: skipped; critical experts at int4; r = 0.50 ... 1.00}"
set grid
set key top left box opaque font ',9'
set ylabel 'TPOT (ms, mean over decode steps)'
set yrange [0:380]  # room above the curves for the key
set title "decode time per token vs retention ratio r\n{/*0.8 triangles: the paper's Table 3, in the colour of its series}"
set xlabel 'retention ratio r (average share of experts kept critical, Eq. 4)'
plot for [i=1:words(series)] sprintf('$r%d', i) using 1:2 smooth unique with linespoints lw 2 \
     pt point(i) lc colour(i) dt dash(i) \
     title sprintf('%s, %g GB, %s', strat(i), budget(i), rnd(i)), \
     for [i=1:4] sprintf('$pt%d', i) using 1:2 with points pt 9 ps 2 lc colour(i) \
     title (i == 1 ? 'paper, Table 3 (r = 0.75)' : '')
set title 'decode time per token vs the quality it keeps'
set xlabel 'gate mass run at HI precision: int4, critical (%)'
plot for [i=1:words(series)] sprintf('$h%d', i) using 1:2 smooth unique with linespoints lw 2 \
     pt point(i) lc colour(i) dt dash(i) \
     title sprintf('%s, %g GB, %s', strat(i), budget(i), rnd(i))
set title "the paper's accuracy vs r (Table 2)\n{/*0.8 Figure 11's points; not simulated: a trace has no accuracy}"
set xlabel 'retention ratio r'
set ylabel 'accuracy (%)'
set xrange [0.5:1.02]
set yrange [40:75]
set key bottom right box opaque font ',9'
plot for [b=1:3] for [k=1:2] sprintf('$acc%d_%d', b, k) using 1:2 with linespoints lw 2 \
     pt (k == 1 ? 9 : 11) ps 1.4 lc (b + 4) dt k \
     title sprintf('%s, %s', word(benches, b), word(paper_strats, k))
unset multiplot
