set terminal pngcairo size 700,450
set output 'accuracy-ttft.png'
set title 'TTFT per codec, 8192-token context'
set ylabel 'TTFT (s)'
set yrange [0:*]
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
plot 'accuracy-ttft.dat' u 2:xtic(1) t 'from 50% remaining', '' u 3 t 'from 0% remaining', 0.2125 w l dt 2 t 'all in memory'
