//! Fused q/k/v projections stored in an order of their own: group by group (for each
//! key/value head, the rows of the query heads that share it, then its key rows, then
//! its value rows: Falcon's `query_key_value`; GPT-NeoX's, with one query head per
//! group, is head by head: q₀ k₀ v₀ q₁ k₁ v₁ …), or in CodeGen's blocks; and other
//! fused projections stored group by group (Qwen3-Next's linear attention). Ours are
//! the parts one after the other (all query rows, then key, then value rows), so
//! loading and saving permute the rows.

/// The head counts of a fused q/k/v projection stored group by group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedHeads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads, one per group of `heads / kv_heads` query heads.
    pub kv_heads: usize,
    /// Rows of one head.
    pub head_dim: usize,
    /// How the rows are laid out.
    pub layout: FusedLayout,
}

/// The order of a fused q/k/v projection's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedLayout {
    /// Group by group: each key/value head's query heads, then its key and value rows.
    GroupByGroup,
    /// CodeGen's: `blocks` blocks (its model-parallel shards, 4), each holding a
    /// `1/blocks` share of the query rows, then of the value rows, then of the key
    /// rows (q, v, k: in that order).
    Blocks {
        /// Blocks of rows.
        blocks: usize,
    },
    /// Each of `heads` groups holds its rows of every part in turn, `shares[p]` rows of
    /// part `p` (unused shares 0), where ours are the parts one after the other:
    /// Qwen3-Next's linear attention stores its queries, keys, values and output gate
    /// (`in_proj_qkvz`), and its `b` and `a` (`in_proj_ba`), key head by key head. Here
    /// `heads` counts the groups; `kv_heads` and `head_dim` are unused.
    Parts {
        /// Rows of each part in one group.
        shares: [usize; 4],
    },
}

impl FusedHeads {
    /// The row of the fused tensor that holds row `row` of the projections stacked one
    /// after the other (q's `heads · head_dim` rows, then k's and v's
    /// `kv_heads · head_dim` rows each).
    pub fn fused_row(&self, row: usize) -> usize {
        let Self {
            heads,
            kv_heads,
            head_dim,
            layout,
        } = *self;
        if let FusedLayout::Parts { shares } = layout {
            let groups = heads.max(1);
            let group_rows: usize = shares.iter().sum();
            let mut rest = row;
            for (part, &share) in shares.iter().enumerate() {
                if rest < share * groups {
                    let before: usize = shares[..part].iter().sum();
                    return (rest / share) * group_rows + before + rest % share;
                }
                rest -= share * groups;
            }
            // Past every part: no row of a tensor of these sizes.
            return row;
        }
        if let FusedLayout::Blocks { blocks } = layout {
            // Each of q, k and v is `width` rows, cut into `blocks` shares.
            let width = heads * head_dim;
            let share = width / blocks.max(1);
            // Within a block: q's share, then v's, then k's.
            let (part, r) = (row / width, row % width);
            let place = [0, 2, 1][part.min(2)];
            return (r / share) * 3 * share + place * share + r % share;
        }
        let per_group = heads / kv_heads.max(1);
        let group_rows = (per_group + 2) * head_dim;
        let (queries, keys) = (heads * head_dim, kv_heads * head_dim);
        let (head, offset) = match row {
            r if r < queries => (r / head_dim, r % head_dim),
            // A key (`per_group`) or value (`per_group + 1`) head: placed after its
            // group's query heads.
            r => {
                let (part, r) = if r < queries + keys {
                    (0, r - queries)
                } else {
                    (1, r - queries - keys)
                };
                let group = r / head_dim;
                return group * group_rows + (per_group + part) * head_dim + r % head_dim;
            }
        };
        let (group, within) = (head / per_group.max(1), head % per_group.max(1));
        group * group_rows + within * head_dim + offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heads of 2 rows. GPT-NeoX (one query head per group): q₀ q₀ k₀ k₀ v₀ v₀ q₁ q₁ k₁
    /// k₁ v₁ v₁. Falcon with 4 query heads in 2 groups: q₀ q₁ k₀ v₀ q₂ q₃ k₁ v₁.
    /// Multi-query (one group): all q heads, then k, then v, as stacked.
    #[test]
    fn rows_go_group_by_group_or_in_blocks() {
        let rows = |fused: FusedHeads, count: usize| -> Vec<usize> {
            (0..count).map(|row| fused.fused_row(row)).collect()
        };
        let neox = FusedHeads {
            heads: 2,
            kv_heads: 2,
            head_dim: 2,
            layout: FusedLayout::GroupByGroup,
        };
        // q₀ q₀ q₁ q₁ | k₀ k₀ k₁ k₁ | v₀ v₀ v₁ v₁
        assert_eq!(rows(neox, 12), [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
        let falcon = FusedHeads {
            heads: 4,
            kv_heads: 2,
            head_dim: 1,
            layout: FusedLayout::GroupByGroup,
        };
        // q₀ q₁ q₂ q₃ | k₀ k₁ | v₀ v₁
        assert_eq!(rows(falcon, 8), [0, 1, 4, 5, 2, 6, 3, 7]);
        let multi_query = FusedHeads {
            heads: 3,
            kv_heads: 1,
            head_dim: 2,
            layout: FusedLayout::GroupByGroup,
        };
        assert_eq!(rows(multi_query, 10), (0..10).collect::<Vec<_>>());
        // CodeGen: 4 heads of 2 rows in 2 blocks, each q q q q | v v v v | k k k k of
        // two heads: q₀ q₁ v₀ v₁ k₀ k₁ q₂ q₃ v₂ v₃ k₂ k₃ (by heads).
        let codegen = FusedHeads {
            heads: 4,
            kv_heads: 4,
            head_dim: 2,
            layout: FusedLayout::Blocks { blocks: 2 },
        };
        let q: Vec<usize> = (0..4).chain(12..16).collect();
        let k: Vec<usize> = (8..12).chain(20..24).collect();
        let v: Vec<usize> = (4..8).chain(16..20).collect();
        assert_eq!(rows(codegen, 24), [q, k, v].concat());
        // Qwen3-Next: 2 groups of one row of the first two parts and two of the third:
        // a b c c | a b c c.
        let parts = FusedHeads {
            heads: 2,
            kv_heads: 2,
            head_dim: 0,
            layout: FusedLayout::Parts {
                shares: [1, 1, 2, 0],
            },
        };
        assert_eq!(rows(parts, 8), [0, 4, 1, 5, 2, 3, 6, 7]);
    }
}
