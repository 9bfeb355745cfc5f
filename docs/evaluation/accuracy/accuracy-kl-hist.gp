set terminal pngcairo size 800,500
set output 'accuracy-kl-hist.png'
set title 'KL(p_{f16} || p_{codec}) per position, 256 positions after a 2048-token context'
set xlabel 'log10 KL (nats); first bin includes smaller values'
set ylabel 'positions'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -45
plot 'accuracy-kl-hist.dat' u 2:xtic(sprintf('%.1f', $1)) t 'q8', '' u 3 t 'q4', '' u 4 t 'cachegen'
