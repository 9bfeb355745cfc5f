set terminal pngcairo size 800,500
set output 'accuracy-cycles.png'
set title 'KL after each evict/restore cycle (mean and max over 256 positions)'
set xlabel 'cycle'
set ylabel 'KL (nats)'
set logscale y
set xrange [0.5:10.5]
set key outside right
plot 'accuracy-cycles.dat' u 1:2 w lp lc 1 pt 7 t 'q8 mean', '' u 1:3 w lp lc 1 dt 2 pt 6 t 'q8 max', 'accuracy-cycles.dat' u 1:4 w lp lc 2 pt 7 t 'q4 mean', '' u 1:5 w lp lc 2 dt 2 pt 6 t 'q4 max', 'accuracy-cycles.dat' u 1:6 w lp lc 3 pt 7 t 'cachegen mean', '' u 1:7 w lp lc 3 dt 2 pt 6 t 'cachegen max'
