set terminal pngcairo size 900,500
set output 'bench-models-memory.png'
set title 'Memory held after each request'
set xlabel 'request (switch)'
set ylabel 'MiB'
set key top left
set arrow from graph 0, first 1509.6 to graph 1, first 1509.6 nohead dt 2
plot 'bench-models.dat' index 0 using 1:3 with linespoints title 'mzcache', 'bench-models.dat' index 1 using 1:3 with linespoints title 'mzcache-behind', 'bench-models.dat' index 2 using 1:3 with linespoints title 'all-in-memory'
