set terminal pngcairo size 1000,840
set output 'multitask-trace.png'
set multiplot layout 3,1 title 'Memory trace: LLM + apps in one memory cgroup (limit 856 MiB)'
set ylabel 'MiB'
set key outside right
set yrange [0:984]
set title 'ospaging' noenhanced
plot 'trace-ospaging.dat' u 1:($3+$4) w filledcurves x1 lc rgb '#f4a261' t 'apps', '' u 1:3 w filledcurves x1 lc rgb '#2a9d8f' t 'LLM', '' u 1:2 w l lc rgb 'black' t 'cgroup usage', '' u 1:5 w l dt 3 lw 2 lc rgb '#6a4c93' t 'its page cache', 856.0 w l dt 2 lc rgb 'red' t 'limit', 'events-ospaging.dat' u 1:(strcol(2) eq 'kill' ? 898.8 : 1/0) w p pt 2 ps 2 lw 2 lc rgb 'red' t 'LLM killed', '' u 1:(strcol(2) eq 'query' ? 941.6 : 1/0) w p pt 9 ps 1.5 lc rgb 'blue' t 'query', '' u 1:(strcol(2) eq 'cold' ? 941.6 : 1/0) w p pt 8 ps 1.5 lc rgb 'red' t 'cold start + query', '' u 1:(strcol(2) eq 'event' ? 25.7 : 1/0) w p pt 7 ps 0.5 lc rgb 'purple' t 'pressure event', '' u 1:(strcol(2) eq 'restore' ? 59.9 : 1/0) w p pt 6 ps 0.8 lc rgb 'dark-green' t 'restore-ahead slice'
set title 'mz25' noenhanced
plot 'trace-mz25.dat' u 1:($3+$4) w filledcurves x1 lc rgb '#f4a261' t 'apps', '' u 1:3 w filledcurves x1 lc rgb '#2a9d8f' t 'LLM', '' u 1:2 w l lc rgb 'black' t 'cgroup usage', '' u 1:5 w l dt 3 lw 2 lc rgb '#6a4c93' t 'its page cache', 856.0 w l dt 2 lc rgb 'red' t 'limit', 'events-mz25.dat' u 1:(strcol(2) eq 'kill' ? 898.8 : 1/0) w p pt 2 ps 2 lw 2 lc rgb 'red' t 'LLM killed', '' u 1:(strcol(2) eq 'query' ? 941.6 : 1/0) w p pt 9 ps 1.5 lc rgb 'blue' t 'query', '' u 1:(strcol(2) eq 'cold' ? 941.6 : 1/0) w p pt 8 ps 1.5 lc rgb 'red' t 'cold start + query', '' u 1:(strcol(2) eq 'event' ? 25.7 : 1/0) w p pt 7 ps 0.5 lc rgb 'purple' t 'pressure event', '' u 1:(strcol(2) eq 'restore' ? 59.9 : 1/0) w p pt 6 ps 0.8 lc rgb 'dark-green' t 'restore-ahead slice'
set title 'pool25' noenhanced
set xlabel 'time (s)'
plot 'trace-pool25.dat' u 1:($3+$4) w filledcurves x1 lc rgb '#f4a261' t 'apps', '' u 1:3 w filledcurves x1 lc rgb '#2a9d8f' t 'LLM', '' u 1:2 w l lc rgb 'black' t 'cgroup usage', '' u 1:5 w l dt 3 lw 2 lc rgb '#6a4c93' t 'its page cache', 856.0 w l dt 2 lc rgb 'red' t 'limit', 'events-pool25.dat' u 1:(strcol(2) eq 'kill' ? 898.8 : 1/0) w p pt 2 ps 2 lw 2 lc rgb 'red' t 'LLM killed', '' u 1:(strcol(2) eq 'query' ? 941.6 : 1/0) w p pt 9 ps 1.5 lc rgb 'blue' t 'query', '' u 1:(strcol(2) eq 'cold' ? 941.6 : 1/0) w p pt 8 ps 1.5 lc rgb 'red' t 'cold start + query', '' u 1:(strcol(2) eq 'event' ? 25.7 : 1/0) w p pt 7 ps 0.5 lc rgb 'purple' t 'pressure event', '' u 1:(strcol(2) eq 'restore' ? 59.9 : 1/0) w p pt 6 ps 0.8 lc rgb 'dark-green' t 'restore-ahead slice'
unset multiplot
