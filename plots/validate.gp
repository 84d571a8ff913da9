# Simulated vs measured TPOT, one point per (policy, budget) of `moesim validate --csv`, with the
# y = x line: points on the line are configurations the simulator predicted exactly. As the other
# plots, it reads the CSV path from the variable `csv` and leaves terminal and output to the
# caller (`moesim plot validate --csv experiments/validation/gpu/validate.csv -o DIR`, or
# scripts/gpu-first-run.sh report).
# Columns: policy,configuration,sim_tpot_ms,real_tpot_ms,tpot_err,sim_ttft_ms,real_ttft_ms,ttft_err,total_err,real_tpot_lo_ms,real_tpot_hi_ms
if (!exists("csv")) csv = 'experiments/validation/gpu/validate.csv'
set datafile separator ','
set key top left
set logscale xy
set xlabel 'measured TPOT on the GPU (ms)'
set ylabel 'simulated TPOT (ms)'
set title 'moesim sim vs replay: TPOT per policy and budget'
set grid
stats csv using 4 nooutput
lo = STATS_min * 0.8
hi = STATS_max * 1.25
stats csv using 3 nooutput
if (STATS_min * 0.8 < lo) lo = STATS_min * 0.8
if (STATS_max * 1.25 > hi) hi = STATS_max * 1.25
set xrange [lo:hi]
set yrange [lo:hi]
plot x with lines dashtype 2 lc rgb '#888888' title 'y = x', \
     csv using 4:3:(stringcolumn(1)) every ::1 with labels point pt 7 ps 0.8 offset 0.8,0.4 font ',8' notitle, \
     1.05 * x with lines dashtype 3 lc rgb '#cc8888' title '±5 %', \
     0.95 * x with lines dashtype 3 lc rgb '#cc8888' notitle
