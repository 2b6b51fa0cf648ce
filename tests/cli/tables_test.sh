#!/usr/bin/env bash
# analyze's tables for a paper (docs/metrics.md, "The analysis table"): --summary keeps exactly the mean and worst
# rows of the full table, --columns chooses and orders its metric columns with the same cells, methods come in the
# order given, the latex caption names only what is shown, and bad choices are refused (exit 2) naming the id and
# listing the valid ones, with nothing written.
#
#   tables_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"

sample=$root/experiments/data/use-lite
methods=(--tensors "$sample" --method index@paper --method fp32 --method bf16)

# same DESCRIPTION EXPECTED ACTUAL: byte-for-byte equality, with a diff on failure
same() {
  if [ "$2" == "$3" ]; then pass=$((pass + 1)); else
    echo "FAIL: $1"; diff <(echo "$2") <(echo "$3") | head -8; fail=$((fail + 1)); fi
}

# pick CSV HEADER...: the layer, head and method columns of CSV and then the columns with these headers, in this order
pick() {
  local csv=$1
  shift
  awk -F, -v want="$(IFS=';'; echo "$*")" 'BEGIN { OFS = ","; n = split(want, w, ";") }
    NR == 1 { for (i = 1; i <= NF; ++i) at[$i] = i; for (j = 1; j <= n; ++j) if (!(w[j] in at)) { print "no column " w[j]; exit 1 } }
    { line = $1 OFS $2 OFS $3; for (j = 1; j <= n; ++j) line = line OFS $at[w[j]]; print line }' <<<"$csv"
}

# ---- --summary: the mean and worst rows of the full table, byte for byte ----------------------------------------
full_csv=$(q analyze "${methods[@]}" --format csv)
summary_csv=$(q analyze "${methods[@]}" --format csv --summary)
same "--summary csv: the header and the full table's all/mean and all/worst rows" \
  "$(head -1 <<<"$full_csv"; grep '^all,' <<<"$full_csv")" "$summary_csv"
check "--summary csv: 1 + 2 x 3 lines" [ "$(wc -l <<<"$summary_csv")" -eq 7 ]
check "--summary csv: no per-head rows" [ -z "$(grep -v '^all,' <<<"$summary_csv" | tail -n +2)" ]
check "the full table has per-head rows (8 heads x 3 methods)" [ "$(grep -cv '^all,' <<<"$full_csv")" -eq 25 ]

# md: the description line is the same, and each summary row holds the cells of the full table's row
full_md=$(q analyze "${methods[@]}")
summary_md=$(q analyze "${methods[@]}" --summary)
same "--summary md: the description line" "$(head -1 <<<"$full_md")" "$(head -1 <<<"$summary_md")"
cells() { grep -E '^\| (layer|all) ' | tr -s ' '; }
same "--summary md: the full table's header and all rows, cell by cell" "$(cells <<<"$full_md")" "$(cells <<<"$summary_md")"
check "--summary md: 2 + 6 table lines" [ "$(grep -c '^|' <<<"$summary_md")" -eq 8 ]

# ---- --columns: the full table's columns, in the order given ----------------------------------------------------
cols_csv=$(q analyze "${methods[@]}" --format csv --columns P_kl_mean,O_rmse,P_cossim,O_one_minus_cossim)
same "--columns csv: the full table's P KL, O RMSE, P CosSim and O 1-CosSim columns in this order" \
  "$(pick "$full_csv" "P KL" "O RMSE" "P CosSim" "O 1-CosSim")" "$cols_csv"
every=O_cossim,O_one_minus_cossim,O_rel_l1,O_rmse,P_cossim,P_one_minus_cossim,P_rel_l1,P_rmse,P_max_abs,P_bias,P_kl_mean
same "--columns with every column in the table's order: the full table" "$full_csv" \
  "$(q analyze "${methods[@]}" --format csv --columns $every)"
same "--summary --columns csv: the summary rows of the chosen columns" \
  "$(pick "$summary_csv" "P bias" "P max abs")" "$(q analyze "${methods[@]}" --format csv --summary --columns P_bias,P_max_abs)"

kv_full=$(q analyze --tensors "$sample" --kv rtn:bits=8 --method fp32 --method index --format csv)
same "--kv --columns: V_bits, K_bits and P_rel_l1" "$(pick "$kv_full" "V bits" "K bits" "P rel L1")" \
  "$(q analyze --tensors "$sample" --kv rtn:bits=8 --method fp32 --method index --format csv --columns V_bits,K_bits,P_rel_l1)"
sm_full=$(q analyze --tensors "$sample" --softmax-only --method index --method sas --format csv)
same "--softmax-only --summary --columns: P_rmse, P_one_minus_cossim" \
  "$(pick "$sm_full" "P RMSE" "P 1-CosSim" | awk -F, 'NR == 1 || $1 == "all"')" \
  "$(q analyze --tensors "$sample" --softmax-only --method index --method sas --format csv --summary --columns P_rmse,P_one_minus_cossim)"

# ---- methods in the order given ---------------------------------------------------------------------------------
order=$(q analyze --tensors "$sample" --method bf16 --method index@paper --method fp32 --format csv --summary | cut -d, -f3 | tail -n +2 | tr '\n' ' ')
same "--summary: methods in the order given" "bf16 bf16 index@paper index@paper fp32 fp32 " "$order"
order=$(q analyze --tensors "$sample" --method bf16 --method index@paper --method fp32 --format csv |
  awk -F, '$1 == "1" && $2 == "3" {printf "%s ", $3}')
same "per-head rows: methods in the order given" "bf16 index@paper fp32 " "$order"

# ---- latex: the caption names only what is shown ----------------------------------------------------------------
latex=$(q analyze "${methods[@]}" --format latex --summary --columns P_kl_mean,O_rmse)
check "latex --summary --columns: the caption names the columns and mean and worst" \
  grep -qxF '\caption{Attention error vs fp64 attention: P KL, O RMSE; mean and worst over 8 heads of use-lite; qattn '"$(q --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+')"'.}' <<<"$latex"
check "latex --summary --columns: the header" grep -qxF 'layer & head & method & P KL & O RMSE \\' <<<"$latex"
same "latex --summary --columns: the summary rows of the csv, as cells" \
  "$(pick "$summary_csv" "P KL" "O RMSE" | tail -n +2 | sed 's/,/ \& /g; s/$/ \\\\/')" "$(grep '^all & ' <<<"$latex")"
check "latex --summary: one \\midrule (none before the first row)" [ "$(grep -c '^\\midrule$' <<<"$latex")" -eq 1 ]
latex_cols=$(q analyze "${methods[@]}" --format latex --columns P_cossim)
check "latex --columns: the per-head rows and the rule above the summary" [ "$(grep -c '^\\midrule$' <<<"$latex_cols")" -eq 2 ]
check "latex --columns: the caption names the column, not mean and worst" \
  grep -qE '^\\caption\{Attention error vs fp64 attention: P CosSim; 8 heads of use-lite; qattn ' <<<"$latex_cols"
check "latex --summary: no column list in the caption" \
  grep -qE '^\\caption\{Attention error vs fp64 attention, mean and worst over 8 heads of use-lite; qattn ' \
  <<<"$(q analyze "${methods[@]}" --format latex --summary)"

# ---- refusals: exit 2, the id named, the valid ones listed, nothing written -------------------------------------
valid="the columns of this analysis are O_cossim, O_one_minus_cossim, O_rel_l1, O_rmse, P_cossim, P_one_minus_cossim, P_rel_l1, P_rmse, P_max_abs, P_bias, P_kl_mean$"
expect 2 "--columns: column 'P_kl' is not a column; $valid" "an unknown id" -- \
  analyze "${methods[@]}" --columns O_rmse,P_kl
expect 2 "--columns: column 'O_rmse' is given twice; $valid" "an id twice" -- \
  analyze "${methods[@]}" --columns O_rmse,P_bias,O_rmse
expect 2 "--columns: column item 2 of 3 is empty; $valid" "an empty item" -- analyze "${methods[@]}" --columns O_rmse,,P_bias
expect 2 "--columns: column item 2 of 2 is empty; " "a trailing comma" -- analyze "${methods[@]}" --columns O_rmse,
expect 2 "--columns: column item 1 of 1 is empty; " "an empty list" -- analyze "${methods[@]}" --columns ""
expect 2 "--columns: column 'O_cossim' is an O column and softmax-only analysis has no O; the columns of this analysis are P_cossim, P_one_minus_cossim, P_rel_l1, P_rmse, P_max_abs, P_bias, P_kl_mean$" \
  "an O column in softmax-only analysis" -- analyze --tensors "$sample" --softmax-only --method index --columns P_bias,O_cossim
expect 2 "--columns: column 'K_bits' needs a KV quantizer.*; $valid" "K_bits without --kv" -- \
  analyze "${methods[@]}" --columns K_bits
expect 2 "--summary: chooses what a table shows \(md, csv, latex\); the JSON report keeps every row and metric" \
  "--summary with json" -- analyze "${methods[@]}" --summary --format json
expect 2 "--columns: chooses what a table shows" "--columns with json" -- analyze "${methods[@]}" --columns P_bias --format json
expect 2 "--summary: chooses what a rendered table shows; a --shard part holds every row and metric" "--summary with --shard" -- \
  analyze "${methods[@]}" --summary --shard 0/2
expect 2 "--columns: column 'nope' is not a column" "checked before any tensor is read" -- \
  analyze --tensors "$tmp/no-such-dump" --method fp32 --columns nope
expect 2 "--columns: column 'nope' is not a column" "a refusal writes nothing" -- \
  analyze "${methods[@]}" --columns nope --out "$tmp/t.md"
check "a refusal writes nothing: no --out file" [ ! -e "$tmp/t.md" ]

# ---- merge renders the same choices ------------------------------------------------------------------------------
if q analyze "${methods[@]}" --format csv --shard 0/2 --out "$tmp/p0.json" 2>/dev/null; then
  q analyze "${methods[@]}" --format csv --shard 1/2 --out "$tmp/p1.json" 2>/dev/null
  same "merge --summary --columns: the unsharded table" \
    "$(q analyze "${methods[@]}" --format csv --summary --columns P_kl_mean,O_rmse)" \
    "$(q merge "$tmp/p0.json" "$tmp/p1.json" --summary --columns P_kl_mean,O_rmse 2>/dev/null)"
  expect 2 "--columns: column 'nope' is not a column" "merge --columns unknown" -- merge "$tmp/p0.json" "$tmp/p1.json" --columns nope
  expect 2 "--summary: .*summary" "merge --summary json" -- merge "$tmp/p0.json" "$tmp/p1.json" --summary --format json
else echo "tables_test: this build cannot hash (no OpenSSL): merge not checked"; fi

expect 0 "--summary .*mean and worst rows" "--help names --summary" -- analyze --help
expect 0 "--columns .*P_kl_mean" "--help names --columns and the ids" -- analyze --help

echo "tables_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
