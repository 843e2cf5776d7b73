# phases: run.sh <phase> ; trees: main = repo root, lean/skip/nc = .snap/<t> over root
R=$PWD; export PYTHONUNBUFFERED=1
arm() {  # arm <tag> <backend> <mode>
  local pp=$R; [ $1 != main ] && [ $1 != fa4 ] && pp=$R/.snap/$1:$R
  (cd $R && PYTHONPATH=$pp timeout ${T:-150} python scripts/ab/bwd_cells.py $1 $2 $3 2>&1 | grep -v -i warn)
}
case $1 in
tlxgate) arm main tlx cg > $OUT/g1.log & arm main tlx ng > $OUT/g2.log & arm lean tlx cg > $OUT/g3.log &
         arm skip tlx fg > $OUT/g4.log & arm nc tlx fng > $OUT/g5.log & wait; cat $OUT/g?.log;;
tlx1) arm main tlx cnt; arm lean tlx ct; arm skip tlx ft; arm nc tlx fnt;;
tlx2) arm nc tlx fnt; arm skip tlx ft; arm lean tlx ct; arm main tlx cnt;;
cutegate) arm main cute cng > $OUT/c1.log & arm lean cute cg > $OUT/c2.log & arm fa4 fa4 cng > $OUT/c3.log & wait; cat $OUT/c?.log;;
cute) arm main cute cnt; arm lean cute ct; arm fa4 fa4 cnt; arm fa4 fa4 cnt; arm lean cute ct; arm main cute cnt;;
esac
