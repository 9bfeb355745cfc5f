set terminal pngcairo size 700,400
set output 'accuracy-space.png'
set title 'KV space savings on real KV'
set ylabel 'space saving (%)'
set yrange [0:100]
set style data histogram
set style fill solid 0.8 border -1
set boxwidth 0.7
plot 'accuracy-space.dat' u 2:xtic(1) notitle
