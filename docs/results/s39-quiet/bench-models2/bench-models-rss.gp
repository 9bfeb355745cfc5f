set terminal pngcairo size 1000,550
set output 'bench-models-rss.png'
set title 'RSS over time per system (solid: RSS; dashed: anonymous; the rest is mapped page cache)'
set xlabel 'seconds since the first request (systems alternated step by step)'
set ylabel 'MiB'
set key outside right
set arrow from graph 0, first 1509.6 to graph 1, first 1509.6 nohead dt 3 lc rgb 'gray'
plot 'bench-models-rss.dat' index 0 using 1:2 with lines lc 1 lw 2 title 'mzcache', 'bench-models-rss.dat' index 0 using 1:3 with lines lc 1 dt 2 title 'mzcache anon', 'bench-models-rss.dat' index 1 using 1:2 with lines lc 2 lw 2 title 'mzcache-behind', 'bench-models-rss.dat' index 1 using 1:3 with lines lc 2 dt 2 title 'mzcache-behind anon', 'bench-models-rss.dat' index 2 using 1:2 with lines lc 3 lw 2 title 'all-in-memory', 'bench-models-rss.dat' index 2 using 1:3 with lines lc 3 dt 2 title 'all-in-memory anon'
