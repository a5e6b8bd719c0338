import { useEffect, useState } from 'react';
import { Link } from 'react-router-dom';
import { client, ok } from './api';

/** Campaign names by id, each read once per page load: a campaign's name never changes. */
const names = new Map<string, Promise<string | null>>();

function nameOf(id: string): Promise<string | null> {
  let name = names.get(id);
  if (!name) {
    name = ok(client.GET('/admin/coupons/{couponId}', { params: { path: { couponId: id } } })).then(
      (c) => c.name,
      () => {
        // Asked again next time: a blip must not leave the id nameless for the rest of the visit.
        names.delete(id);
        return null;
      },
    );
    names.set(id, name);
  }
  return name;
}

/**
 * A campaign as operators know it, "#12 满100减50": the id at once, the name once read (`compact`:
 * the id alone, the name on hover, for a narrow table column). A link to the campaign's page; a
 * click on it does not also toggle the table row it sits in.
 */
export function CampaignRef({ id, compact = false }: { id: string; compact?: boolean }) {
  const [name, setName] = useState<string | null>(null);
  useEffect(() => {
    let current = true;
    void nameOf(id).then((n) => current && setName(n));
    return () => {
      current = false;
    };
  }, [id]);
  return (
    <Link to={`/campaigns/${id}`} onClick={(e) => e.stopPropagation()} data-testid={`campaign-ref-${id}`} title={name ?? undefined}>
      #{id}
      {name && !compact && ` ${name}`}
    </Link>
  );
}
