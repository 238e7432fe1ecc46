-- Reference participant `stock`: interchangeable units. A guarded non-negative counter plus a
-- quantity hold row; counters change only together with a winning hold transition.
CREATE TABLE stock_item (
    resource  text   PRIMARY KEY,
    available bigint NOT NULL CHECK (available >= 0),
    held      bigint NOT NULL DEFAULT 0 CHECK (held >= 0),
    confirmed bigint NOT NULL DEFAULT 0 CHECK (confirmed >= 0)
);

CREATE TABLE stock_hold (
    reservation_id text        NOT NULL,
    branch_id      text        NOT NULL,
    resource       text        NOT NULL REFERENCES stock_item (resource),
    quantity       bigint      NOT NULL CHECK (quantity > 0),
    state          text        NOT NULL CHECK (state IN ('held', 'confirmed', 'cancelled')),
    held_until     timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (reservation_id, branch_id, resource)
);
